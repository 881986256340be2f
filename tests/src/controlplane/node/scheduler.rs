//! kube-scheduler for the test node, so that Pods of Deployments (no `nodeName`) land on it.
//! It authenticates as the admin, like the controller-manager.

use std::path::Path;
use std::time::Duration;

use crate::controlplane::launch::{Component, LaunchError, Launched, args};

/// Starts kube-scheduler with the admin kubeconfig at `kubeconfig` and waits until its
/// `/healthz` answers; `admin` is the matching client configuration.
pub async fn start(
    program: &Path,
    dir: &Path,
    kubeconfig: &Path,
    admin: &kube::Config,
    timeout: Duration,
) -> Result<Launched, LaunchError> {
    let cert_dir = dir.join("scheduler-certs");
    let component = Component {
        name: "kube-scheduler",
        program,
        log: dir.join("kube-scheduler.log"),
        ports: 1,
        timeout,
    };
    let kubeconfig = kubeconfig.display().to_string();
    component
        .launch(
            |ports| {
                let port = ports.first().copied().unwrap_or_default();
                args([
                    format!("--kubeconfig={kubeconfig}"),
                    format!("--authentication-kubeconfig={kubeconfig}"),
                    format!("--authorization-kubeconfig={kubeconfig}"),
                    "--leader-elect=false".to_owned(),
                    "--bind-address=127.0.0.1".to_owned(),
                    format!("--secure-port={port}"),
                    format!("--cert-dir={}", cert_dir.display()),
                ])
            },
            |ports| {
                let config = admin.clone();
                async move {
                    let port = ports.first().copied().unwrap_or_default();
                    crate::controlplane::controller_manager::probe_self_signed(
                        config, port, "/healthz",
                    )
                    .await
                }
            },
        )
        .await
}
