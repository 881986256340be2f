//! Precompiled components on disk, keyed by the plugin's sha256 digest and the engine's
//! compatibility hash.
//!
//! # Guarantee: only artifacts this process wrote are deserialized
//!
//! Deserializing a precompiled artifact runs its machine code: bytes from anyone else (another
//! process, a tampered volume, a leftover from an older build) could do anything. So the cache
//! trusts only what is recorded in a process-wide table at the moment this process writes an
//! artifact: its path and the sha256 of its bytes. A load reads the file into memory, checks
//! the hash against the table and deserializes those very bytes (no second read, so no window
//! between check and use). A file not in the table, or whose bytes changed, is ignored and
//! overwritten by a fresh compile.
//!
//! The table lives in memory, so the guarantee holds across any number of registries and
//! engines in one process (the operator's restarts of a registry, tests), and a new process
//! compiles each plugin once before it trusts its own artifacts again. That costs tens of
//! milliseconds per plugin at start-up, and removes any need to trust the cache directory.
//!
//! Writes are atomic (temporary file in the same directory, then rename): a reader never sees
//! a partial artifact.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::engine::WasmError;

/// Artifacts written by this process: path → sha256 of the bytes written.
static WRITTEN: LazyLock<Mutex<HashMap<PathBuf, [u8; 32]>>> = LazyLock::new(Default::default);
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn written() -> MutexGuard<'static, HashMap<PathBuf, [u8; 32]>> {
    WRITTEN.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("failed to create cache directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to read cached artifact {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write cached artifact {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to serialize the compiled component")]
    Serialize(#[source] WasmError),
    #[error("failed to deserialize cached artifact {path}")]
    Deserialize {
        path: PathBuf,
        #[source]
        source: WasmError,
    },
}

/// A directory of precompiled artifacts for one engine configuration.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

impl ArtifactCache {
    /// Uses (and creates) `dir`. Artifacts of other engine configurations may share it: the
    /// engine's compatibility hash is part of every file name.
    pub fn new(dir: &Path, engine: &Engine) -> Result<Self, CacheError> {
        let create_err = |source| CacheError::CreateDir {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(create_err)?;
        let dir = std::fs::canonicalize(dir).map_err(create_err)?;
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(ArtifactCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        })
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The component for `digest`, if this process wrote its artifact and the file still holds
    /// exactly those bytes. `Ok(None)` means: compile it.
    pub fn load(&self, engine: &Engine, digest: &str) -> Result<Option<Component>, CacheError> {
        let path = self.path(digest);
        let Some(expected) = written().get(&path).copied() else {
            return Ok(None);
        };
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                written().remove(&path);
                return Ok(None);
            }
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        if Sha256::digest(&bytes).as_slice() != expected {
            tracing::warn!(path = %path.display(), "cached artifact changed since this process wrote it; recompiling");
            written().remove(&path);
            return Ok(None);
        }
        deserialize(engine, &bytes)
            .map(Some)
            .map_err(|e| CacheError::Deserialize {
                path,
                source: e.into(),
            })
    }

    /// Writes the artifact of `component` atomically and records it as ours.
    pub fn store(&self, digest: &str, component: &Component) -> Result<(), CacheError> {
        let bytes = component
            .serialize()
            .map_err(|e| CacheError::Serialize(e.into()))?;
        let path = self.path(digest);
        let tmp = self.dir.join(format!(
            ".{digest}.{}.{}.tmp",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(source) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(CacheError::Write { path, source });
        }
        let hash: [u8; 32] = Sha256::digest(&bytes).into();
        written().insert(path, hash);
        Ok(())
    }
}

/// Deserializes bytes that [`ArtifactCache::load`] verified to be this process's own output.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `bytes` hash to what this process recorded when it serialized a component with an
    // engine of the same compatibility hash (part of the file name), so they are wasmtime's own
    // output for this configuration, not foreign machine code.
    unsafe { Component::deserialize(engine, bytes) }
}
