//! Where the node's programs are: `$VMOP_NODE_BIN`, or the cache directory that
//! `tests/node/build.sh` fills (building them the first time, which takes minutes).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::controlplane::BinariesError;
use crate::controlplane::binaries::run_build_script;

/// Names the directory `tests/node/build.sh` printed; skips the build script.
pub const NODE_BIN_DIR_ENV: &str = "VMOP_NODE_BIN";

/// What the directory holds, relative to it.
const FILES: [&str; 9] = [
    "bin/kubelet",
    "bin/kube-scheduler",
    "bin/containerd",
    "bin/containerd-shim-runc-v2",
    "bin/ctr",
    "bin/runc",
    "cni/loopback",
    "images/pause.tar",
    "images/pause.ref",
];

#[derive(Debug, thiserror::Error)]
pub enum NodeBinariesError {
    #[error("failed to build the node's programs")]
    Build(#[source] BinariesError),
    #[error(
        "{path} is missing: the directory of {NODE_BIN_DIR_ENV} or of tests/node/build.sh must hold {FILES:?}"
    )]
    Missing { path: PathBuf },
    #[error("failed to read the pause image's name from {path}")]
    PauseRef {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The output directory of `tests/node/build.sh`: `bin/` (kubelet, kube-scheduler, containerd,
/// ctr, containerd-shim-runc-v2, runc, pause), `cni/` (loopback) and `images/` (the pause
/// image's OCI archive and its name).
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    dir: PathBuf,
    pause_image: String,
}

impl NodeBinaries {
    /// Finds the programs, running the build script at most once per process. Blocks.
    pub fn locate() -> Result<Self, NodeBinariesError> {
        static LOCATED: Mutex<Option<NodeBinaries>> = Mutex::new(None);
        let mut located = LOCATED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(binaries) = located.as_ref() {
            return Ok(binaries.clone());
        }
        let dir = match std::env::var_os(NODE_BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/build.sh");
                run_build_script(&script, "node").map_err(NodeBinariesError::Build)?
            }
        };
        if let Some(path) = FILES.iter().map(|f| dir.join(f)).find(|p| !p.is_file()) {
            return Err(NodeBinariesError::Missing { path });
        }
        let ref_path = dir.join("images/pause.ref");
        let pause_image = std::fs::read_to_string(&ref_path)
            .map_err(|source| NodeBinariesError::PauseRef {
                path: ref_path,
                source,
            })?
            .trim()
            .to_owned();
        let binaries = Self { dir, pause_image };
        *located = Some(binaries.clone());
        Ok(binaries)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A program of `bin/`: kubelet, kube-scheduler, containerd, ctr, runc, pause...
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// The directory of the CNI plugins (loopback).
    pub fn cni_dir(&self) -> PathBuf {
        self.dir.join("cni")
    }

    /// The OCI archive of the pause image, imported into every node.
    pub fn pause_archive(&self) -> PathBuf {
        self.dir.join("images/pause.tar")
    }

    /// The pause image's name (`vmop.dev/node/pause:1`): containerd's sandbox image, and an
    /// image tests may run.
    pub fn pause_image(&self) -> &str {
        &self.pause_image
    }
}
