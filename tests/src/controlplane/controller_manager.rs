//! kube-controller-manager with only the garbage collector and the namespace controller, for
//! tests that need cascading deletion. It authenticates as the admin.

use std::path::Path;
use std::time::Duration;

use super::launch::{Component, LaunchError, Launched, args};

/// Starts the controller-manager with the admin kubeconfig at `kubeconfig`. `admin` is the
/// matching client configuration, used (with its cluster URL replaced) to probe `/healthz`.
pub async fn start(
    program: &Path,
    dir: &Path,
    kubeconfig: &Path,
    admin: &kube::Config,
    timeout: Duration,
) -> Result<Launched, LaunchError> {
    let cert_dir = dir.join("controller-manager-certs");
    let component = Component {
        name: "kube-controller-manager",
        program,
        log: dir.join("kube-controller-manager.log"),
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
                    "--controllers=garbage-collector-controller,namespace-controller".to_owned(),
                    "--leader-elect=false".to_owned(),
                    "--bind-address=127.0.0.1".to_owned(),
                    format!("--secure-port={port}"),
                    format!("--cert-dir={}", cert_dir.display()),
                ])
            },
            |ports| {
                let mut config = admin.clone();
                async move {
                    let port = ports.first().copied().unwrap_or_default();
                    config.cluster_url = format!("https://127.0.0.1:{port}")
                        .parse()
                        .map_err(|error| format!("bad controller-manager URL: {error}"))?;
                    // It serves with a certificate it generated itself.
                    config.root_cert = None;
                    config.accept_invalid_certs = true;
                    super::apiserver::probe(config, "/healthz").await
                }
            },
        )
        .await
}
