//! Loading one path: confine it to the plugin directory, read and verify the file, and find
//! or build the one [`Plugin`] of its digest (compiled on the blocking pool, or mapped from
//! the disk cache, then `info()` checked).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::{LoadError, Loaded, PluginEvent, PluginRegistry, Served};
use crate::plugin::bindings::WIT_VERSION;
use crate::plugin::component::{Plugin, exported_wit_version};
use crate::plugin::files::{FileStamp, check_pin, parse_pin, relative, wit_compatible};
use crate::plugin::sandbox::CallContext;
use crate::telemetry::metrics::LoadOutcome;

impl PluginRegistry {
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
        let stamp = FileStamp::of(&full).await.map_err(LoadError::read(&rel))?;
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

    /// Records a load that did real work (see the module docs of [`super`]).
    pub(super) fn record_load(
        &self,
        result: &Result<(Arc<Plugin>, Served), LoadError>,
        started: Instant,
    ) {
        if let Some(metrics) = self.inner.metrics.get()
            && !matches!(result, Ok((_, Served::Memory)))
        {
            metrics.plugin_load(LoadOutcome::of(result), started.elapsed());
        }
    }

    /// The file for `rel`, which must resolve (symlinks followed) inside the plugin directory.
    pub(super) fn resolve(&self, rel: &Path) -> Result<PathBuf, LoadError> {
        let full = std::fs::canonicalize(self.inner.dir.join(rel)).map_err(LoadError::read(rel))?;
        if !full.starts_with(&self.inner.dir) {
            return Err(LoadError::InvalidPath {
                path: rel.to_path_buf(),
                reason: "resolves outside the plugin directory",
            });
        }
        Ok(full)
    }

    /// Reads `full` and serves its plugin for `rel`, announcing a swap when the digest changed.
    /// A pin mismatch also stops serving whatever `rel` served before.
    pub(super) async fn reload(
        &self,
        rel: &Path,
        full: &Path,
        stamp: FileStamp,
        pin: Option<String>,
    ) -> Result<(Arc<Plugin>, Served), LoadError> {
        let bytes = tokio::fs::read(full).await.map_err(LoadError::read(rel))?;
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
            let _ = self.inner.events.send(PluginEvent::swapped(rel, &plugin));
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
        if let Some(exported) = exported_wit_version(&inner.engine, &component)
            && !wit_compatible(&exported, WIT_VERSION)
        {
            return Err(LoadError::IncompatibleWit {
                path: rel.to_path_buf(),
                plugin: exported,
                host: WIT_VERSION,
            });
        }
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
