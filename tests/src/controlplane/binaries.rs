//! Where the control-plane binaries are: `$VMOP_CONTROLPLANE_BIN`, or the cache directory that
//! `tests/controlplane/build.sh` fills (building them the first time, which takes minutes).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Names a directory holding every binary below; skips the build script.
pub const BIN_DIR_ENV: &str = "VMOP_CONTROLPLANE_BIN";

const TOOLS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
];

#[derive(Debug, thiserror::Error)]
pub enum BinariesError {
    #[error("{path} is missing: {BIN_DIR_ENV} must name a directory holding {TOOLS:?}")]
    MissingInEnvDir { path: PathBuf },
    #[error("failed to run the build script {script}")]
    RunScript {
        script: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the build script {script} failed ({status}); its output is above")]
    ScriptFailed { script: PathBuf, status: String },
    #[error("the build script printed {dir}, which lacks {missing}")]
    MissingInCache { dir: PathBuf, missing: String },
}

/// The directory holding etcd, kube-apiserver, kube-controller-manager and kubectl.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Finds the binaries, running the build script at most once per process. Blocks.
    pub fn locate() -> Result<Self, BinariesError> {
        static LOCATED: Mutex<Option<Binaries>> = Mutex::new(None);
        let mut located = LOCATED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(binaries) = located.as_ref() {
            return Ok(binaries.clone());
        }
        let binaries = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) => Self::from_env_dir(PathBuf::from(dir))?,
            None => Self::build()?,
        };
        *located = Some(binaries.clone());
        Ok(binaries)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }

    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }

    fn from_env_dir(dir: PathBuf) -> Result<Self, BinariesError> {
        if let Some(missing) = first_missing(&dir) {
            return Err(BinariesError::MissingInEnvDir { path: missing });
        }
        Ok(Self { dir })
    }

    fn build() -> Result<Self, BinariesError> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/build.sh");
        let dir = run_build_script(&script, "controlplane")?;
        if let Some(missing) = first_missing(&dir) {
            return Err(BinariesError::MissingInCache {
                dir,
                missing: missing.display().to_string(),
            });
        }
        Ok(Self { dir })
    }
}

/// Runs a build script of `tests/` (controlplane/build.sh, node/build.sh) with its progress on
/// our stderr and returns the directory it prints on its last line of stdout. `label` prefixes
/// the progress lines. Blocks while the script builds (minutes the first time).
pub(super) fn run_build_script(script: &Path, label: &str) -> Result<PathBuf, BinariesError> {
    let started = Instant::now();
    eprintln!("{label}: locating binaries with {}", script.display());
    let output = Command::new(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| BinariesError::RunScript {
            script: script.to_path_buf(),
            source,
        })?;
    if !output.status.success() {
        return Err(BinariesError::ScriptFailed {
            script: script.to_path_buf(),
            status: output.status.to_string(),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = PathBuf::from(
        stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim(),
    );
    eprintln!(
        "{label}: binaries ready in {} ({:.1} s)",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

fn first_missing(dir: &Path) -> Option<PathBuf> {
    TOOLS
        .iter()
        .map(|tool| dir.join(tool))
        .find(|path| !path.is_file())
}
