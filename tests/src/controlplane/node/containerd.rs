//! containerd for a test node: its configuration (version 3, containerd 2.x) and how it is
//! started. Everything it keeps is below `<node dir>/containerd`; its socket is its own, so
//! each node of a control plane has its own containerd (own root, state, sockets, runc root,
//! CNI configuration), its streaming server on the node's loopback address.
//!
//! Nothing is ever pulled from outside the machine: the sandbox image is the project's pause
//! image, imported before kubelet starts, and every registry is mapped to `127.0.0.1:1`
//! (`certs.d/_default/hosts.toml`), so a Pod naming an image that was not imported fails to
//! pull at once instead of reaching the internet.

use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::controlplane::launch::{Component, LaunchError, Launched, args};

use super::binaries::NodeBinaries;

/// containerd's files below the node's directory.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub socket: PathBuf,
}

impl Layout {
    pub fn new(node_dir: &Path) -> Self {
        let dir = node_dir.join("containerd");
        Self {
            socket: dir.join("containerd.sock"),
            dir,
        }
    }

    fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni")
    }

    fn registry_dir(&self) -> PathBuf {
        self.dir.join("certs.d")
    }
}

/// Starts containerd with the files [`write_files`] wrote and waits until `ctr version` gets
/// an answer from it.
pub async fn start(
    binaries: &NodeBinaries,
    layout: &Layout,
    timeout: Duration,
) -> Result<Launched, LaunchError> {
    let program = binaries.bin("containerd");
    let component = Component {
        name: "containerd",
        program: &program,
        log: layout.dir.join("containerd.log"),
        ports: 0,
        timeout,
    };
    let ctr = binaries.bin("ctr");
    let config = layout.config();
    component
        .launch(
            |_| args([format!("--config={}", config.display())]),
            |_| {
                let mut version = tokio::process::Command::new(&ctr);
                version
                    .arg(format!("--address={}", layout.socket.display()))
                    .arg("version")
                    .kill_on_drop(true);
                async move {
                    let output = version.output().await.map_err(|e| e.to_string())?;
                    match output.status.success() {
                        true => Ok(()),
                        false => Err(format!(
                            "ctr version: {}",
                            String::from_utf8_lossy(&output.stderr).trim()
                        )),
                    }
                }
            },
        )
        .await
}

/// Writes the configuration, the CNI network and the registry mapping; `address` is the
/// node's.
pub fn write_files(binaries: &NodeBinaries, layout: &Layout, address: Ipv4Addr) -> io::Result<()> {
    let default_registry = layout.registry_dir().join("_default");
    for dir in [&layout.dir, &layout.cni_conf_dir(), &default_registry] {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(layout.config(), configuration(binaries, layout, address))?;
    // Loopback alone: only hostNetwork Pods run here, and containerd reports the network
    // ready once it has loaded a network besides its own loopback one.
    std::fs::write(
        layout.cni_conf_dir().join("10-vmop-loopback.conflist"),
        r#"{"cniVersion":"1.0.0","name":"vmop-loopback","plugins":[{"type":"loopback"}]}"#,
    )?;
    std::fs::write(
        default_registry.join("hosts.toml"),
        "# Every registry is this closed loopback port: nothing is pulled from outside.\n\
         server = \"http://127.0.0.1:1\"\n",
    )
}

/// The configuration, version 3 (containerd 2.x): own root, state and sockets; runc through
/// cgroupfs; the CRI plugin with the project's pause image, the loopback network and no
/// streaming port of its own choosing; no plugin that would write outside the node's
/// directory (NRI's socket in /var/run/nri, the `opt` plugin's /opt/containerd).
///
/// `restrict_oom_score_adj`: containers get no lower OOM score adjustment than containerd's
/// own. kubelet asks -998 for every sandbox, which needs CAP_SYS_RESOURCE; where that is
/// missing (this machine's root lacks it) runc could not start any Pod.
fn configuration(binaries: &NodeBinaries, layout: &Layout, address: Ipv4Addr) -> String {
    let dir = layout.dir.display();
    let socket = layout.socket.display();
    let shim = binaries.bin("containerd-shim-runc-v2");
    let runc = binaries.bin("runc");
    format!(
        r#"version = 3
root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "{address}"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  cdi_spec_dirs = []

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{shim}"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{dir}/state/runc"
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"

[plugins."io.containerd.cri.v1.images".registry]
  config_path = "{registry}"
"#,
        shim = shim.display(),
        runc = runc.display(),
        cni_bin = binaries.cni_dir().display(),
        cni_conf = layout.cni_conf_dir().display(),
        pause = binaries.pause_image(),
        registry = layout.registry_dir().display(),
    )
}
