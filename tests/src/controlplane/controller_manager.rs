//! kube-controller-manager, authenticating as the admin: the garbage collector and the
//! namespace controller for tests that need cascading deletion, and with a node the
//! controllers Pods and Deployments need as well ([`NODE_CONTROLLERS`]).

use std::path::Path;
use std::time::Duration;

use super::launch::{Component, LaunchError, Launched, args};

/// The controllers of a control plane without a node.
pub const CONTROLLERS: &str = "garbage-collector-controller,namespace-controller";

/// The controllers of a control plane with a node: Deployments make ReplicaSets make Pods;
/// every namespace gets its `default` ServiceAccount (the ServiceAccount admission plugin,
/// on with a node, refuses Pods without it) and its `kube-root-ca.crt` ConfigMap (the CA
/// half of a Pod's projected token volume, without which it never starts); the node
/// lifecycle controller lifts the `not-ready` taint the apiserver puts on every new Node.
pub const NODE_CONTROLLERS: &str = "garbage-collector-controller,namespace-controller,\
    deployment-controller,replicaset-controller,serviceaccount-controller,\
    root-ca-certificate-publisher-controller,node-lifecycle-controller";

/// Starts the controller-manager with the admin kubeconfig at `kubeconfig`, running
/// `controllers` (one of the lists above); `root_ca` is the CA the root-CA publisher hands to
/// Pods. `admin` is the matching client configuration, used (with its cluster URL replaced)
/// to probe `/healthz`.
pub async fn start(
    program: &Path,
    dir: &Path,
    kubeconfig: &Path,
    admin: &kube::Config,
    controllers: &str,
    root_ca: &Path,
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
                    format!("--controllers={controllers}"),
                    format!("--root-ca-file={}", root_ca.display()),
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
                    probe_self_signed(config, port, "/healthz").await
                }
            },
        )
        .await
}

/// `GET path` on a component serving on `127.0.0.1:port` with a certificate it generated
/// itself (controller-manager, scheduler), with the identity of `config`.
pub(super) async fn probe_self_signed(
    mut config: kube::Config,
    port: u16,
    path: &str,
) -> Result<(), String> {
    config.cluster_url = format!("https://127.0.0.1:{port}")
        .parse()
        .map_err(|error| format!("bad URL for port {port}: {error}"))?;
    config.root_cert = None;
    config.accept_invalid_certs = true;
    super::apiserver::probe(config, path).await
}
