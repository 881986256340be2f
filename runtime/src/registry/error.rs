//! [`LoadError`]: why a plugin file could not be served.

use std::path::{Path, PathBuf};

use crate::engine::WasmError;
use crate::precompile::CompileError;
use crate::sandbox::CallError;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid plugin path {path}: {reason}")]
    InvalidPath { path: PathBuf, reason: &'static str },
    #[error("invalid sha256 pin {pin:?}: expected 64 hex digits")]
    InvalidPin { pin: String },
    #[error("failed to read plugin file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("plugin file {path} is larger than the limit of {limit} bytes")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("plugin file {path} changed while it was being loaded")]
    Changed { path: PathBuf },
    #[error("plugin digest mismatch: pinned sha256 {expected}, file has {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("plugin {path} could not be compiled")]
    Compile {
        path: PathBuf,
        #[source]
        source: CompileError,
    },
    #[error("compilation of plugin {path} did not complete")]
    CompileTask {
        path: PathBuf,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("plugin {path} needs imports the host does not provide")]
    Link {
        path: PathBuf,
        #[source]
        source: WasmError,
    },
    #[error("plugin {path} failed its info() call")]
    Info {
        path: PathBuf,
        #[source]
        source: CallError,
    },
    #[error("plugin {path} was built for WIT {plugin}, the host speaks {host}")]
    IncompatibleWit {
        path: PathBuf,
        plugin: String,
        host: &'static str,
    },
}

impl LoadError {
    /// For `map_err`: an I/O failure on `path`.
    pub(crate) fn read(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError {
        let path = path.to_path_buf();
        move |source| LoadError::Read { path, source }
    }
}
