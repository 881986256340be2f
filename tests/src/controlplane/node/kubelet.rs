//! kubelet for a test node: its configuration file and how it is started.
//!
//! Node `i` is named `127.0.0.<i+1>` ([`node_address`]), which kubelet takes as its address
//! too. A loopback address is refused by `--node-ip` (kubelet's `validateNodeIP` rejects
//! loopback addresses), but a hostname override that parses as an IP becomes the node's
//! InternalIP unvalidated; so the Node, its Pods' `hostIP` and hostNetwork Pods' `podIP` are
//! all that address, and the apiserver reaches kubelet (logs, exec) on loopback only, never on
//! a private address. kubelet's server and healthz ports are bound on that address alone, so
//! several nodes' kubelets coexist on one host, each on its own loopback address.
//!
//! Everything it writes is under the node's directory (root dir, certificates, Pod logs,
//! volume plugins), except what kubelet hard-codes: `/var/lib/kubelet/device-plugins` and
//! `/var/log/containers` (see `teardown.rs` and `device_plugins.rs`).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::controlplane::launch::{Component, LaunchError, Launched, args};

/// The first node's name and address.
pub const NODE_NAME: &str = "127.0.0.1";

/// The most nodes a control plane may have (`127.0.0.1` to `127.0.0.<MAX_NODES>`).
pub const MAX_NODES: usize = 8;

/// Node `index`'s address (and name): `127.0.0.<index + 1>`.
pub fn node_address(index: usize) -> Ipv4Addr {
    let last = u8::try_from(index.saturating_add(1)).unwrap_or(u8::MAX);
    Ipv4Addr::new(127, 0, 0, last)
}

/// Where kubelet keeps its files, below the node's directory, and who it is.
pub struct Paths<'a> {
    /// The node's name and address (`--hostname-override`, server and healthz address).
    pub address: Ipv4Addr,
    /// The node's directory.
    pub dir: &'a Path,
    /// kubelet's kubeconfig (its own client certificate).
    pub kubeconfig: &'a Path,
    /// containerd's socket, the CRI endpoint.
    pub containerd_socket: &'a Path,
}

/// Starts kubelet with a configuration written to `<dir>/kubelet.json` and waits until it
/// answers `/healthz` (the Node being Ready is waited for by the caller). `cgroup_root` is
/// the node's own cgroup root (`cgroups.rs`).
pub async fn start(
    program: &Path,
    paths: &Paths<'_>,
    cgroup_root: &str,
    timeout: Duration,
) -> Result<Launched, LaunchError> {
    let dir = paths.dir;
    let config = dir.join("kubelet.json");
    let root_dir = dir.join("kubelet");
    let component = Component {
        name: "kubelet",
        program,
        log: dir.join("kubelet.log"),
        ports: 2,
        timeout,
    };
    component
        .launch(
            |ports| {
                let (port, healthz) = ports_of(ports);
                let document = configuration(paths, cgroup_root, port, healthz);
                // A failed write shows as kubelet failing to read its configuration, with
                // this line above its log tail in the error.
                if let Err(error) = std::fs::write(&config, document) {
                    eprintln!("node: failed to write {}: {error}", config.display());
                }
                args([
                    format!("--config={}", config.display()),
                    format!("--kubeconfig={}", paths.kubeconfig.display()),
                    format!("--root-dir={}", root_dir.display()),
                    format!("--cert-dir={}", root_dir.join("pki").display()),
                    format!("--hostname-override={}", paths.address),
                ])
            },
            |ports| async move {
                let (_, healthz) = ports_of(&ports);
                let address = paths.address;
                tokio::task::spawn_blocking(move || healthy(address, healthz))
                    .await
                    .map_err(|error| error.to_string())?
            },
        )
        .await
}

/// kubelet's server port and its healthz port, in the order `launch` hands them out.
fn ports_of(ports: &[u16]) -> (u16, u16) {
    (
        ports.first().copied().unwrap_or_default(),
        ports.get(1).copied().unwrap_or_default(),
    )
}

/// The KubeletConfiguration (v1beta1 of Kubernetes v1.37; JSON, which kubelet reads as YAML).
fn configuration(paths: &Paths<'_>, cgroup_root: &str, port: u16, healthz: u16) -> String {
    let endpoint = format!("unix://{}", paths.containerd_socket.display());
    // "0%" disables a threshold: a full-ish disk or busy memory must not taint the node.
    let no_eviction = json!({
        "memory.available": "0%",
        "nodefs.available": "0%",
        "nodefs.inodesFree": "0%",
        "imagefs.available": "0%",
        "imagefs.inodesFree": "0%",
    });
    let document = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // cgroup v1 hosts (this one) are refused by default since Kubernetes v1.35.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": false,
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "address": paths.address.to_string(),
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": paths.address.to_string(),
        "healthzPort": healthz,
        // The apiserver (logs, exec) connects without a client certificate: anyone who can
        // reach loopback may use this kubelet, which only tests do.
        "authentication": {
            "anonymous": { "enabled": true },
            "webhook": { "enabled": false },
        },
        "authorization": { "mode": "AlwaysAllow" },
        "evictionHard": no_eviction,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podLogsDir": paths.dir.join("pod-logs"),
        "volumePluginDir": paths.dir.join("volume-plugins"),
        "makeIPTablesUtilChains": false,
        // Not the default -999: lowering it needs CAP_SYS_RESOURCE, which root may lack here.
        "oomScoreAdj": 0,
        "shutdownGracePeriod": "0s",
        "logging": { "verbosity": 1 },
    });
    document.to_string()
}

/// `GET /healthz` over plain HTTP/1.0 on kubelet's healthz address and port; it answers `ok`.
fn healthy(address: Ipv4Addr, port: u16) -> Result<(), String> {
    let exchange = || -> io::Result<String> {
        let socket = SocketAddr::from((address, port));
        let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let request = format!("GET /healthz HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    match exchange() {
        Ok(response) if response.starts_with("HTTP/1.0 200") && response.ends_with("ok") => Ok(()),
        Ok(response) => Err(format!("GET /healthz answered {response:?}")),
        Err(error) => Err(format!("GET /healthz failed: {error}")),
    }
}
