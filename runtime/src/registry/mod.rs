//! [`PluginRegistry`]: plugin files from the plugin directory, verified, compiled once per
//! digest, kept current when the files change.
//!
//! # Guarantees
//!
//! - A path must stay inside the plugin directory, after following symlinks.
//! - With a pin, a file whose sha256 differs is refused ([`LoadError::DigestMismatch`]) and any
//!   earlier version of that path stops being served.
//! - One [`Plugin`] per digest: loading the same content again (another path, another
//!   ProviderConfig, a file touched without changes) reuses it ([`RegistryStats::digest_hits`]);
//!   a digest no path serves any more is dropped ([`PluginRegistry::plugins_held`];
//!   `loading::replacing_the_file_switches_versions_without_failing_calls_in_flight`).
//! - Compilation runs on the blocking pool, never on the caller's async worker, one at a time
//!   (a compile of a Python or JavaScript plugin takes ~400 MB and seconds of CPU), in this
//!   process or, with [`PluginRegistry::with_compiler`], in a child that gives that memory back
//!   ([`super::precompile`]); an authenticated artifact from the [`ArtifactCache`] replaces it,
//!   also after a restart.
//! - A file over [`PluginRegistry::with_max_plugin_bytes`] (default
//!   [`DEFAULT_MAX_PLUGIN_BYTES`]) is refused ([`LoadError::TooLarge`]) without being read; the
//!   digest is computed streaming (see `files.rs`).
//! - `info()` is called once per digest; its `wit_version` must have the host's major.minor.
//! - A file that failed to load for a reason of its own (content, size, pin, WIT) is not read
//!   nor compiled again while it and the pin stay the same, for [`FAILED_RETRY`] doubling up
//!   to [`FAILED_RETRY_MAX`]: every caller meanwhile gets [`LoadError::Repeated`] after one
//!   `stat`, so a broken plugin cannot keep the one-compilation lock, or the CPU, busy
//!   (`tests::a_broken_file_is_not_compiled_again_until_it_changes`).
//!
//! # Changes
//!
//! Every `load` compares the file's metadata (size, mtime, inode) with what was loaded and
//! re-reads it when they differ. [`PluginRegistry::watch`] does the same for every loaded path
//! periodically (polling works on every volume type, including ConfigMap symlink swaps, where
//! inotify is unreliable). A changed file is loaded and swapped in atomically: the path then
//! resolves to the new `Plugin`, while calls holding the old `Arc<Plugin>` finish on it. A
//! file that changed into something that does not load stops being served. Each swap or
//! failure is announced on [`PluginRegistry::subscribe`], so the controller can re-enqueue
//! the VMs of the ProviderConfigs using that path.
//!
//! # Observing loads
//!
//! With [`PluginRegistry::with_observer`], every load that did real work (read, verify, compile
//! or map from the disk cache, `info()`) and every failed load is reported to a
//! [`LoadObserver`] (the operator's `vmop_plugin_load_seconds`); loads answered from memory
//! (unchanged file, known digest) are not, so it sees what loading costs rather than how often
//! the controller asks.
//!
//! # Layout
//!
//! - this module: the registry's state and its read-only API;
//! - [`load`]: loading one path (resolve, verify, compile, `info()`);
//! - [`watch`]: change detection and [`PluginEvent`]s;
//! - [`files`]: where plugin files come from (confined paths, pins, stamps, bounded reads);
//! - [`single`]: a registry over one file, for the commands that try one plugin;
//! - [`error`]: the [`LoadError`] of every step.

mod error;
mod files;
mod load;
mod single;
mod watch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;

pub use error::LoadError;
pub use single::SingleFileError;
pub use watch::PluginEvent;

use super::cache::ArtifactCache;
use super::component::Plugin;
use super::engine::PluginEngine;
use super::precompile::Compiler;
use super::sandbox::CallLimits;
use crate::report::LoadObserver;
pub use files::DEFAULT_MAX_PLUGIN_BYTES;
use files::{FileStamp, relative};

/// Counters that make the registry's caching observable.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RegistryStats {
    /// Components compiled from wasm.
    pub compiled: u64,
    /// Components deserialized from authenticated precompiled artifacts (this process's or an
    /// earlier one's).
    pub disk_hits: u64,
    /// Loads answered by an already-loaded digest.
    pub digest_hits: u64,
    /// Loads answered by a remembered failure ([`LoadError::Repeated`]).
    pub repeated_failures: u64,
}

/// How long a file that failed to load is not tried again, unless it changes.
pub const FAILED_RETRY: Duration = Duration::from_secs(30);
/// The longest such wait, after repeated failures of the same file.
pub const FAILED_RETRY_MAX: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub plugin_dir: PathBuf,
    /// Where precompiled artifacts go; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Limits of the `info()` call made at load.
    pub info_limits: CallLimits,
}

/// The plugins of one plugin directory. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct PluginRegistry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    engine: Arc<PluginEngine>,
    dir: PathBuf,
    cache: Option<ArtifactCache>,
    info_limits: CallLimits,
    tables: Mutex<Tables>,
    /// One compilation at a time: they are CPU-bound, and a second load of the same digest
    /// waiting here finds the first one's result.
    compiling: tokio::sync::Mutex<()>,
    events: broadcast::Sender<PluginEvent>,
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    digest_hits: AtomicU64,
    repeated_failures: AtomicU64,
    max_plugin_bytes: AtomicU64,
    observer: OnceLock<Arc<dyn LoadObserver>>,
    compiler: OnceLock<Compiler>,
}

/// Whether a successful load did real work or was answered from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// Read, verified, compiled or mapped, and `info()` called.
    Loaded,
    /// The file was unchanged, or its digest already loaded.
    Memory,
}

#[derive(Debug, Default)]
struct Tables {
    by_digest: HashMap<String, Arc<Plugin>>,
    by_path: HashMap<PathBuf, Loaded>,
    /// The last failure of each path that failed for a reason of the file's own.
    failed: HashMap<PathBuf, Failed>,
}

impl Tables {
    /// Drops the plugins no path serves any more (a replaced or broken file's old version):
    /// calls in flight keep theirs alive until they end; a later load of that digest compiles
    /// again, or maps it from the disk cache.
    fn forget_unserved(&mut self) {
        let Tables {
            by_digest, by_path, ..
        } = self;
        by_digest.retain(|digest, _| by_path.values().any(|l| l.plugin.digest() == digest));
    }
}

#[derive(Debug)]
struct Failed {
    stamp: FileStamp,
    pin: Option<String>,
    /// The failure as it was said, and whether it was a digest mismatch.
    cause: String,
    mismatch: bool,
    /// Failures in a row of this path, for the doubling wait.
    times: u32,
    retry_at: tokio::time::Instant,
}

#[derive(Debug)]
struct Loaded {
    plugin: Arc<Plugin>,
    stamp: FileStamp,
    pin: Option<String>,
}

impl PluginRegistry {
    /// A registry over `config.plugin_dir` (which must exist). A cache directory that cannot
    /// be created disables the disk cache with a warning rather than failing.
    pub fn new(engine: Arc<PluginEngine>, config: RegistryConfig) -> Result<Self, LoadError> {
        let dir = std::fs::canonicalize(&config.plugin_dir)
            .map_err(LoadError::read(&config.plugin_dir))?;
        let cache = config.cache_dir.as_deref().and_then(|d| {
            ArtifactCache::new(d, engine.engine())
                .inspect_err(|e| tracing::warn!(error = %e, "plugin artifact cache disabled"))
                .ok()
        });
        let (events, _) = broadcast::channel(64);
        Ok(PluginRegistry {
            inner: Arc::new(Inner {
                engine,
                dir,
                cache,
                info_limits: config.info_limits,
                tables: Mutex::default(),
                compiling: tokio::sync::Mutex::new(()),
                events,
                compiled: AtomicU64::new(0),
                disk_hits: AtomicU64::new(0),
                digest_hits: AtomicU64::new(0),
                repeated_failures: AtomicU64::new(0),
                max_plugin_bytes: AtomicU64::new(DEFAULT_MAX_PLUGIN_BYTES),
                observer: OnceLock::new(),
                compiler: OnceLock::new(),
            }),
        })
    }

    /// Reports loads to `observer` (see the module docs). A registry reports to one observer:
    /// the first call wins, later ones are ignored.
    pub fn with_observer(self, observer: Arc<dyn LoadObserver>) -> Self {
        let _ = self.inner.observer.set(observer);
        self
    }

    /// Refuses plugin files larger than `max` bytes (see the module docs).
    pub fn with_max_plugin_bytes(self, max: u64) -> Self {
        self.inner.max_plugin_bytes.store(max, Ordering::Relaxed);
        self
    }

    /// Compiles with `compiler` instead of in this process (see [`Compiler`]). The first call
    /// wins, later ones are ignored.
    pub fn with_compiler(self, compiler: Compiler) -> Self {
        let _ = self.inner.compiler.set(compiler);
        self
    }

    fn compiler(&self) -> Compiler {
        self.inner.compiler.get().cloned().unwrap_or_default()
    }

    fn max_plugin_bytes(&self) -> u64 {
        self.inner.max_plugin_bytes.load(Ordering::Relaxed)
    }

    pub fn engine(&self) -> &Arc<PluginEngine> {
        &self.inner.engine
    }

    pub fn stats(&self) -> RegistryStats {
        let i = &self.inner;
        RegistryStats {
            compiled: i.compiled.load(Ordering::Relaxed),
            disk_hits: i.disk_hits.load(Ordering::Relaxed),
            digest_hits: i.digest_hits.load(Ordering::Relaxed),
            repeated_failures: i.repeated_failures.load(Ordering::Relaxed),
        }
    }

    /// How many compiled plugins the registry holds: one per digest some path serves.
    pub fn plugins_held(&self) -> usize {
        self.tables().by_digest.len()
    }

    /// The plugin currently served for `path`, without touching the file.
    pub fn get(&self, path: impl AsRef<Path>) -> Option<Arc<Plugin>> {
        let rel = relative(path.as_ref()).ok()?;
        self.tables().by_path.get(&rel).map(|l| l.plugin.clone())
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.inner.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;

    fn registry(dir: &Path) -> PluginRegistry {
        let engine = PluginEngine::new(&EngineConfig::default()).unwrap();
        let config = RegistryConfig {
            plugin_dir: dir.to_path_buf(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        };
        PluginRegistry::new(engine, config).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_file_is_not_compiled_again_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.wasm"), b"not a component").unwrap();
        let registry = registry(dir.path());

        let first = registry.load("bad.wasm", None).await.unwrap_err();
        assert!(matches!(first, LoadError::Compile { .. }), "{first:?}");
        let again = registry.load("bad.wasm", None).await.unwrap_err();
        assert!(
            matches!(&again, LoadError::Repeated { retry_in, .. } if *retry_in <= FAILED_RETRY),
            "{again:?}"
        );
        assert!(again.is_invalid_plugin());
        assert_eq!(registry.stats().repeated_failures, 1);

        // Another pin is another question: asked at once (and remembered as a mismatch).
        let pin = "0".repeat(64);
        let pinned = registry.load("bad.wasm", Some(&pin)).await.unwrap_err();
        assert!(
            matches!(pinned, LoadError::DigestMismatch { .. }),
            "{pinned:?}"
        );
        let pinned = registry.load("bad.wasm", Some(&pin)).await.unwrap_err();
        assert!(pinned.is_digest_mismatch(), "{pinned:?}");
        assert_eq!(registry.stats().repeated_failures, 2);

        // A changed file is tried at once.
        std::fs::write(dir.path().join("bad.wasm"), b"still not a component").unwrap();
        let changed = registry.load("bad.wasm", None).await.unwrap_err();
        assert!(matches!(changed, LoadError::Compile { .. }), "{changed:?}");

        // And an unchanged one once the wait is over (it doubled with each failure in a row).
        tokio::time::advance(FAILED_RETRY_MAX).await;
        let retried = registry.load("bad.wasm", None).await.unwrap_err();
        assert!(matches!(retried, LoadError::Compile { .. }), "{retried:?}");
        let again = registry.load("bad.wasm", None).await.unwrap_err();
        assert!(
            matches!(&again, LoadError::Repeated { retry_in, .. } if *retry_in > FAILED_RETRY),
            "{again:?}"
        );
        assert_eq!(registry.stats().compiled, 0);
    }
}
