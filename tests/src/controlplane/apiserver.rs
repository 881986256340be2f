//! kube-apiserver for one control plane: RBAC on, client certificates signed by the test CA,
//! service-account tokens signed by the test key, serving on loopback.

use std::path::Path;
use std::time::Duration;

use super::launch::{Component, LaunchError, Launched, args};
use super::pki::Pki;
use super::process::Process;

/// Where the apiserver keeps what it generates itself (its loopback client certificate).
const CERT_DIR: &str = "apiserver-certs";
/// Service ClusterIPs without a node: never connected to.
const SERVICE_RANGE: &str = "10.0.0.0/24";
/// Service ClusterIPs with a node: on loopback (see [`start`]).
pub const NODE_SERVICE_RANGE: &str = "127.100.0.0/24";

/// Starts kube-apiserver against `etcd_url`. `admin` is a client configuration for an identity
/// allowed to read `/readyz`; its cluster URL is replaced by the apiserver's.
///
/// With `node` false (as in envtest), the ServiceAccount admission plugin is off: no
/// controller creates the `default` ServiceAccounts it requires. A control plane with a node
/// turns it on, so that Pods get their token volumes, and takes its Service ClusterIPs from
/// [`NODE_SERVICE_RANGE`], on loopback: no kube-proxy runs, so a Pod connecting to a ClusterIP
/// (in-cluster configuration's `KUBERNETES_SERVICE_HOST`, for one) must meet a refused
/// loopback connection, not send packets to a private address through the default route.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    program: &Path,
    dir: &Path,
    pki: &Pki,
    etcd_url: &str,
    admin: &kube::Config,
    node: bool,
    extra_args: &[String],
    timeout: Duration,
) -> Result<Launched, LaunchError> {
    let cert_dir = dir.join(CERT_DIR);
    let component = component(program, dir, timeout);
    component
        .launch(
            |ports| {
                let port = ports.first().copied().unwrap_or_default();
                let own = [
                    format!("--etcd-servers={etcd_url}"),
                    format!("--cert-dir={}", cert_dir.display()),
                    format!("--tls-cert-file={}", pki.serving.cert.display()),
                    format!("--tls-private-key-file={}", pki.serving.key.display()),
                    format!("--client-ca-file={}", pki.ca_cert.display()),
                    format!("--secure-port={port}"),
                    "--bind-address=127.0.0.1".to_owned(),
                    // A loopback advertise address is only accepted without an endpoint
                    // reconciler; it keeps the apiserver independent of a default route.
                    "--advertise-address=127.0.0.1".to_owned(),
                    "--endpoint-reconciler-type=none".to_owned(),
                    format!(
                        "--service-cluster-ip-range={}",
                        match node {
                            true => NODE_SERVICE_RANGE,
                            false => SERVICE_RANGE,
                        }
                    ),
                    "--allow-privileged=true".to_owned(),
                    "--authorization-mode=RBAC".to_owned(),
                    match node {
                        true => "--enable-admission-plugins=ServiceAccount".to_owned(),
                        false => "--disable-admission-plugins=ServiceAccount".to_owned(),
                    },
                    // What the operator's sharded VM watch asks for (alpha, off by default).
                    "--feature-gates=ShardedListAndWatch=true".to_owned(),
                    format!("--service-account-issuer=https://127.0.0.1:{port}"),
                    format!(
                        "--service-account-key-file={}",
                        pki.service_account_pub.display()
                    ),
                    format!(
                        "--service-account-signing-key-file={}",
                        pki.service_account_key.display()
                    ),
                ];
                args(own.into_iter().chain(extra_args.iter().cloned()))
            },
            |ports| {
                let mut config = admin.clone();
                async move {
                    let port = ports.first().copied().unwrap_or_default();
                    config.cluster_url = url(port)
                        .parse()
                        .map_err(|error| format!("bad apiserver URL: {error}"))?;
                    probe(config, "/readyz").await
                }
            },
        )
        .await
}

/// Kills the running kube-apiserver `process` and starts it again with the same flags (same
/// port, same etcd), then waits until it answers `/readyz` on `port`.
pub async fn restart(
    program: &Path,
    dir: &Path,
    process: &Process,
    port: u16,
    admin: &kube::Config,
    timeout: Duration,
) -> Result<(), LaunchError> {
    let component = component(program, dir, timeout);
    eprintln!("controlplane: restarting kube-apiserver (port {port})");
    process.respawn().map_err(|source| LaunchError::Spawn {
        name: component.name,
        source,
    })?;
    component
        .wait_ready(process, || {
            let mut config = admin.clone();
            async move {
                config.cluster_url = url(port)
                    .parse()
                    .map_err(|error| format!("bad apiserver URL: {error}"))?;
                probe(config, "/readyz").await
            }
        })
        .await
}

fn component<'a>(program: &'a Path, dir: &Path, timeout: Duration) -> Component<'a> {
    Component {
        name: "kube-apiserver",
        program,
        log: dir.join("kube-apiserver.log"),
        ports: 1,
        timeout,
    }
}

pub fn url(port: u16) -> String {
    format!("https://127.0.0.1:{port}")
}

/// `GET path` with the given identity; `Ok` on a 2xx answer. Used as the readiness probe of the
/// apiserver (`/readyz`) and the controller-manager (`/healthz`).
pub(super) async fn probe(config: kube::Config, path: &str) -> Result<(), String> {
    let client = kube::Client::try_from(config).map_err(|error| error.to_string())?;
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|error| error.to_string())?;
    client
        .request_text(request)
        .await
        .map(drop)
        .map_err(|error| format!("GET {path}: {error}"))
}
