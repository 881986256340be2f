//! [`PluginRegistry`]: plugin files from the plugin directory, verified, compiled once per
//! digest, kept current when the files change.
//!
//! # Guarantees
//!
//! - A path must stay inside the plugin directory, after following symlinks.
//! - With a pin, a file whose sha256 differs is refused ([`LoadError::DigestMismatch`]) and any
//!   earlier version of that path stops being served.
//! - One [`Plugin`] per digest: loading the same content again (another path, another
//!   ProviderConfig, a file touched without changes) reuses it ([`RegistryStats::digest_hits`]).
//! - Compilation runs on the blocking pool, never on the caller's async worker; a precompiled
//!   artifact from the [`ArtifactCache`] replaces it when this process wrote one.
//! - `info()` is called once per digest; its `wit_version` must have the host's major.minor.
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
//! # Metrics
//!
//! With [`PluginRegistry::with_metrics`], every load that did real work (read, verify, compile
//! or map from the disk cache, `info()`) and every failed load is recorded in
//! `vmop_plugin_load_seconds`; loads answered from memory (unchanged file, known digest) are not,
//! so the histogram shows what loading costs rather than how often the controller asks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::broadcast;
use wasmtime::component::Component;

use super::bindings::WIT_VERSION;
use super::cache::ArtifactCache;
use super::component::Plugin;
use super::engine::{PluginEngine, WasmError};
use super::files::{FileStamp, check_pin, parse_pin, relative, wit_compatible};
use super::sandbox::{CallContext, CallError, CallLimits};
use crate::telemetry::metrics::{LoadOutcome, Metrics};

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
    #[error("plugin digest mismatch: pinned sha256 {expected}, file has {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("plugin {path} is not a valid WebAssembly component")]
    Compile {
        path: PathBuf,
        #[source]
        source: WasmError,
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

/// A path's plugin was swapped or stopped being served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginEvent {
    /// Relative to the plugin directory, as passed to [`PluginRegistry::load`].
    pub path: PathBuf,
    /// The digest now served, or `None` when the new file failed to load (`error` says why).
    pub digest: Option<String>,
    pub error: Option<String>,
}

/// Counters that make the registry's caching observable.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RegistryStats {
    /// Components compiled from wasm.
    pub compiled: u64,
    /// Components deserialized from this process's precompiled artifacts.
    pub disk_hits: u64,
    /// Loads answered by an already-loaded digest.
    pub digest_hits: u64,
}

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
    metrics: OnceLock<Metrics>,
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
        let dir = std::fs::canonicalize(&config.plugin_dir).map_err(|source| LoadError::Read {
            path: config.plugin_dir.clone(),
            source,
        })?;
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
                metrics: OnceLock::new(),
            }),
        })
    }

    /// Records loads into `metrics` (see the module docs). A registry records into one
    /// `Metrics`: the first call wins, later ones are ignored.
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        let _ = self.inner.metrics.set(metrics);
        self
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
        }
    }

    /// Swaps and failures of loaded paths, as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.inner.events.subscribe()
    }

    /// The plugin currently served for `path`, without touching the file.
    pub fn get(&self, path: impl AsRef<Path>) -> Option<Arc<Plugin>> {
        let rel = relative(path.as_ref()).ok()?;
        self.tables().by_path.get(&rel).map(|l| l.plugin.clone())
    }

    /// The plugin in `path` (relative to the plugin directory), checked against `pin` (hex
    /// sha256, optionally prefixed `sha256:`). Cheap when the file has not changed since the
    /// last load: one `stat`.
    pub async fn load(
        &self,
        path: impl AsRef<Path>,
        pin: Option<&str>,
    ) -> Result<Arc<Plugin>, LoadError> {
        let started = Instant::now();
        let result = self.load_served(path.as_ref(), pin).await;
        self.record_load(&result, started);
        result.map(|(plugin, _)| plugin)
    }

    async fn load_served(
        &self,
        path: &Path,
        pin: Option<&str>,
    ) -> Result<(Arc<Plugin>, Served), LoadError> {
        let rel = relative(path)?;
        let pin = pin.map(parse_pin).transpose()?;
        let full = self.resolve(&rel)?;
        let stamp = FileStamp::of(&full)
            .await
            .map_err(|source| LoadError::Read {
                path: rel.clone(),
                source,
            })?;
        {
            let mut tables = self.tables();
            if let Some(loaded) = tables.by_path.get_mut(&rel)
                && loaded.stamp == stamp
            {
                check_pin(pin.as_deref(), loaded.plugin.digest())?;
                loaded.pin = pin;
                return Ok((loaded.plugin.clone(), Served::Memory));
            }
        }
        self.reload(&rel, &full, stamp, pin).await
    }

    /// Re-reads every loaded path whose metadata changed; returns (and broadcasts) what
    /// happened to each.
    pub async fn poll_changes(&self) -> Vec<PluginEvent> {
        let loaded: Vec<(PathBuf, FileStamp, Option<String>, String)> = self
            .tables()
            .by_path
            .iter()
            .map(|(p, l)| {
                (
                    p.clone(),
                    l.stamp,
                    l.pin.clone(),
                    l.plugin.digest().to_string(),
                )
            })
            .collect();
        let mut events = Vec::new();
        for (rel, stamp, pin, digest) in loaded {
            let full = self.inner.dir.join(&rel);
            let now = FileStamp::of(&full).await.ok();
            if now == Some(stamp) {
                continue;
            }
            let started = Instant::now();
            let result = match (self.resolve(&rel), now) {
                (Ok(full), Some(now)) => self.reload(&rel, &full, now, pin).await,
                (Err(e), _) => Err(e),
                (Ok(_), None) => Err(LoadError::Read {
                    path: rel.clone(),
                    source: std::io::ErrorKind::NotFound.into(),
                }),
            };
            self.record_load(&result, started);
            match result {
                // `reload` announced the swap already.
                Ok((plugin, _)) if plugin.digest() != digest => events.push(PluginEvent {
                    path: rel,
                    digest: Some(plugin.digest().to_string()),
                    error: None,
                }),
                Ok(_) => {}
                Err(e) => {
                    self.tables().by_path.remove(&rel);
                    let event = PluginEvent {
                        path: rel,
                        digest: None,
                        error: Some(error_chain(&e)),
                    };
                    tracing::warn!(path = %event.path.display(), error = %e, "plugin file changed and no longer loads");
                    let _ = self.inner.events.send(event.clone());
                    events.push(event);
                }
            }
        }
        events
    }

    /// Polls for changes every `interval` until the registry is dropped.
    pub fn watch(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                PluginRegistry { inner }.poll_changes().await;
            }
        })
    }

    fn record_load(&self, result: &Result<(Arc<Plugin>, Served), LoadError>, started: Instant) {
        if let Some(metrics) = self.inner.metrics.get()
            && !matches!(result, Ok((_, Served::Memory)))
        {
            metrics.plugin_load(LoadOutcome::of(result), started.elapsed());
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.inner.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file for `rel`, which must resolve (symlinks followed) inside the plugin directory.
    fn resolve(&self, rel: &Path) -> Result<PathBuf, LoadError> {
        let full =
            std::fs::canonicalize(self.inner.dir.join(rel)).map_err(|source| LoadError::Read {
                path: rel.to_path_buf(),
                source,
            })?;
        if !full.starts_with(&self.inner.dir) {
            return Err(LoadError::InvalidPath {
                path: rel.to_path_buf(),
                reason: "resolves outside the plugin directory",
            });
        }
        Ok(full)
    }

    async fn reload(
        &self,
        rel: &Path,
        full: &Path,
        stamp: FileStamp,
        pin: Option<String>,
    ) -> Result<(Arc<Plugin>, Served), LoadError> {
        let bytes = tokio::fs::read(full)
            .await
            .map_err(|source| LoadError::Read {
                path: rel.to_path_buf(),
                source,
            })?;
        let digest = hex::encode(Sha256::digest(&bytes));
        if let Err(e) = check_pin(pin.as_deref(), &digest) {
            self.tables().by_path.remove(rel);
            return Err(e);
        }
        let (plugin, served) = self.plugin_for(rel, bytes, digest).await?;
        let previous = self.tables().by_path.insert(
            rel.to_path_buf(),
            Loaded {
                plugin: plugin.clone(),
                stamp,
                pin,
            },
        );
        if let Some(previous) = previous
            && previous.plugin.digest() != plugin.digest()
        {
            tracing::info!(path = %rel.display(), from = previous.plugin.digest(), to = plugin.digest(), version = %plugin.info().version, "plugin file changed, new version swapped in");
            let _ = self.inner.events.send(PluginEvent {
                path: rel.to_path_buf(),
                digest: Some(plugin.digest().to_string()),
                error: None,
            });
        }
        Ok((plugin, served))
    }

    /// The one `Plugin` of `digest`, compiled (or deserialized) and initialised if new.
    async fn plugin_for(
        &self,
        rel: &Path,
        bytes: Vec<u8>,
        digest: String,
    ) -> Result<(Arc<Plugin>, Served), LoadError> {
        let inner = &self.inner;
        let _compiling = inner.compiling.lock().await;
        if let Some(plugin) = self.tables().by_digest.get(&digest) {
            inner.digest_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((plugin.clone(), Served::Memory));
        }
        let component = self.compile(rel, bytes, &digest).await?;
        let info_ctx = CallContext {
            limits: inner.info_limits,
            label: format!("plugin:{}", rel.display()),
            ..CallContext::default()
        };
        let plugin = Plugin::prepare(inner.engine.clone(), &component, digest.clone(), &info_ctx)
            .await
            .map_err(|e| LoadError::Link {
                path: rel.to_path_buf(),
                source: e.into(),
            })?
            .map_err(|source| LoadError::Info {
                path: rel.to_path_buf(),
                source,
            })?;
        if !wit_compatible(&plugin.info().wit_version, WIT_VERSION) {
            return Err(LoadError::IncompatibleWit {
                path: rel.to_path_buf(),
                plugin: plugin.info().wit_version.clone(),
                host: WIT_VERSION,
            });
        }
        let plugin = Arc::new(plugin);
        self.tables().by_digest.insert(digest, plugin.clone());
        Ok((plugin, Served::Loaded))
    }

    async fn compile(
        &self,
        rel: &Path,
        bytes: Vec<u8>,
        digest: &str,
    ) -> Result<Component, LoadError> {
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let key = digest.to_string();
        let task = tokio::task::spawn_blocking(move || {
            if let Some(cache) = &cache {
                match cache.load(engine.engine(), &key) {
                    Ok(Some(component)) => return Ok((component, true)),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "ignoring unusable cached artifact"),
                }
            }
            let component = Component::new(engine.engine(), &bytes)?;
            if let Some(cache) = &cache
                && let Err(e) = cache.store(&key, &component)
            {
                tracing::warn!(error = %e, "could not cache the compiled plugin");
            }
            Ok::<_, wasmtime::Error>((component, false))
        });
        let (component, from_disk) = task
            .await
            .map_err(|source| LoadError::CompileTask {
                path: rel.to_path_buf(),
                source,
            })?
            .map_err(|e| LoadError::Compile {
                path: rel.to_path_buf(),
                source: e.into(),
            })?;
        let counter = if from_disk {
            &self.inner.disk_hits
        } else {
            &self.inner.compiled
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(component)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
