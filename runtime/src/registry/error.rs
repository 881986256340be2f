//! [`LoadError`]: why a plugin file could not be served.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
    #[error(
        "plugin {path} was built for WIT {plugin}, the host speaks {host} and loads 0.2 plugins too"
    )]
    IncompatibleWit {
        path: PathBuf,
        plugin: String,
        host: &'static str,
    },
    /// The same file (and pin) failed to load before, for a reason of its own: it is not read
    /// nor compiled again until it changes or `retry_in` has passed.
    /// It reads as the failure did, so that a condition or Event built from it does not change
    /// with each reconcile.
    #[error("{cause}")]
    Repeated {
        path: PathBuf,
        retry_in: Duration,
        /// The failure, as it was said the first time.
        cause: String,
        /// It was a [`LoadError::DigestMismatch`].
        mismatch: bool,
    },
}

impl LoadError {
    /// The file does not have the pinned digest (now, or when it was last tried).
    pub fn is_digest_mismatch(&self) -> bool {
        matches!(
            self,
            LoadError::DigestMismatch { .. } | LoadError::Repeated { mismatch: true, .. }
        )
    }

    /// The file is no plugin this host can run (now, or when it was last tried): it does not
    /// compile, link, answer `info()` or speak the host's WIT.
    pub fn is_invalid_plugin(&self) -> bool {
        matches!(
            self,
            LoadError::Compile { .. }
                | LoadError::Link { .. }
                | LoadError::Info { .. }
                | LoadError::IncompatibleWit { .. }
                | LoadError::Repeated {
                    mismatch: false,
                    ..
                }
        )
    }

    /// Whether this failure is the file's own (its content, pin or WIT), so that loading the
    /// same file again would fail the same way; I/O, size limit and task failures may pass.
    pub(super) fn is_the_files(&self) -> bool {
        matches!(
            self,
            LoadError::DigestMismatch { .. }
                | LoadError::Compile { .. }
                | LoadError::Link { .. }
                | LoadError::Info { .. }
                | LoadError::IncompatibleWit { .. }
        )
    }

    /// For `map_err`: an I/O failure on `path`.
    pub(crate) fn read(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError {
        let path = path.to_path_buf();
        move |source| LoadError::Read { path, source }
    }
}
