//! Loading one path: confine it to the plugin directory, read and verify the file, and find
//! or build the one [`Plugin`] of its digest (compiled on the blocking pool, or mapped from
//! the disk cache, then `info()` checked).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use wasmtime::component::Component;

use super::files::{FileStamp, check_pin, digest_file, parse_pin, read_file, relative};
use super::{
    FAILED_RETRY, FAILED_RETRY_MAX, Failed, LoadError, Loaded, PluginEvent, PluginRegistry, Served,
};
use crate::bindings::{Contract, WIT_VERSION};
use crate::component::{Plugin, exported_wit_version};
use crate::precompile::Compiled;
use crate::sandbox::CallContext;

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
            if let Some(failed) = tables.failed.get(&rel)
                && failed.stamp == stamp
                && failed.pin == pin
                && let Some(retry_in) = failed
                    .retry_at
                    .checked_duration_since(tokio::time::Instant::now())
            {
                self.inner.repeated_failures.fetch_add(1, Ordering::Relaxed);
                return Err(LoadError::Repeated {
                    path: rel,
                    retry_in,
                    cause: failed.cause.clone(),
                    mismatch: failed.mismatch,
                });
            }
        }
        let result = self.reload(&rel, &full, stamp, pin.clone()).await;
        self.remember(&rel, stamp, pin, result)
    }

    /// Remembers a failure of the file's own for `rel` (see the module docs), or forgets an
    /// earlier one once it loads.
    fn remember(
        &self,
        rel: &Path,
        stamp: FileStamp,
        pin: Option<String>,
        result: Result<(Arc<Plugin>, Served), LoadError>,
    ) -> Result<(Arc<Plugin>, Served), LoadError> {
        let mut tables = self.tables();
        let error = match result {
            Ok(loaded) => {
                tables.failed.remove(rel);
                return Ok(loaded);
            }
            Err(error) if error.is_the_files() => error,
            Err(error) => return Err(error),
        };
        let times = tables
            .failed
            .get(rel)
            .map_or(1, |f| f.times.saturating_add(1));
        let wait = FAILED_RETRY
            .saturating_mul(2u32.saturating_pow(times.saturating_sub(1)))
            .min(FAILED_RETRY_MAX);
        tables.failed.insert(
            rel.to_path_buf(),
            Failed {
                stamp,
                pin,
                cause: crate::chain(&error),
                mismatch: error.is_digest_mismatch(),
                times,
                retry_at: tokio::time::Instant::now() + wait,
            },
        );
        Err(error)
    }

    /// Records a load that did real work (see the module docs of [`super`]).
    pub(super) fn record_load(
        &self,
        result: &Result<(Arc<Plugin>, Served), LoadError>,
        started: Instant,
    ) {
        if let Some(observer) = self.inner.observer.get()
            && !matches!(
                result,
                Ok((_, Served::Memory)) | Err(LoadError::Repeated { .. })
            )
        {
            observer.loaded(result.as_ref().map(|_| ()), started.elapsed());
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
        let max = self.max_plugin_bytes();
        let digest = {
            let (rel_owned, full) = (rel.to_path_buf(), full.to_path_buf());
            tokio::task::spawn_blocking(move || digest_file(&rel_owned, &full, max))
                .await
                .map_err(|source| LoadError::CompileTask {
                    path: rel.to_path_buf(),
                    source,
                })?
        };
        let digest = match digest {
            Ok(digest) => digest,
            Err(e) => {
                let mut tables = self.tables();
                tables.by_path.remove(rel);
                tables.forget_unserved();
                return Err(e);
            }
        };
        if let Err(e) = check_pin(pin.as_deref(), &digest) {
            let mut tables = self.tables();
            tables.by_path.remove(rel);
            tables.forget_unserved();
            return Err(e);
        }
        let (plugin, served) = self.plugin_for(rel, full, digest).await?;
        let previous = {
            let mut tables = self.tables();
            let previous = tables.by_path.insert(
                rel.to_path_buf(),
                Loaded {
                    plugin: plugin.clone(),
                    stamp,
                    pin,
                },
            );
            tables.forget_unserved();
            previous
        };
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
        full: &Path,
        digest: String,
    ) -> Result<(Arc<Plugin>, Served), LoadError> {
        let inner = &self.inner;
        let _compiling = inner.compiling.lock().await;
        if let Some(plugin) = self.tables().by_digest.get(&digest) {
            inner.digest_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((plugin.clone(), Served::Memory));
        }
        let component = self.compile(rel, full, &digest).await?;
        // A component that exports no provider interface at all fails to link below, which
        // says so; one that exports a version the host does not load is refused naming both.
        let contract = match exported_wit_version(&inner.engine, &component) {
            None => Contract::V0_3,
            Some(exported) => Contract::of(&exported).ok_or(LoadError::IncompatibleWit {
                path: rel.to_path_buf(),
                plugin: exported,
                host: WIT_VERSION,
            })?,
        };
        let info_ctx = CallContext {
            limits: inner.info_limits,
            label: format!("plugin:{}", rel.display()),
            ..CallContext::default()
        };
        let plugin = Plugin::prepare(
            inner.engine.clone(),
            &component,
            contract,
            digest.clone(),
            &info_ctx,
        )
        .await
        .map_err(|e| LoadError::Link {
            path: rel.to_path_buf(),
            source: e.into(),
        })?
        .map_err(|source| LoadError::Info {
            path: rel.to_path_buf(),
            source,
        })?;
        if Contract::of(&plugin.info().wit_version) != Some(contract) {
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

    /// The component of `digest`: from the authenticated disk cache, or compiled from `full`
    /// (read whole only then, and only if it still has that digest). Runs on the blocking pool;
    /// the caller holds the one-compilation-at-a-time lock.
    async fn compile(&self, rel: &Path, full: &Path, digest: &str) -> Result<Component, LoadError> {
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let key = digest.to_string();
        let max = self.max_plugin_bytes();
        let compiler = self.compiler();
        let (rel_owned, full) = (rel.to_path_buf(), full.to_path_buf());
        let started = Instant::now();
        let task = tokio::task::spawn_blocking(move || {
            if let Some(cache) = &cache {
                match cache.load(engine.engine(), &key) {
                    Ok(Some(component)) => return Ok((component, Origin::Disk)),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "ignoring unusable cached artifact"),
                }
            }
            let (bytes, digest) = read_file(&rel_owned, &full, max)?;
            if digest != key {
                return Err(LoadError::Changed { path: rel_owned });
            }
            let Compiled {
                component,
                in_child,
            } = compiler
                .compile(engine.engine(), &bytes)
                .map_err(|source| LoadError::Compile {
                    path: rel_owned.clone(),
                    source,
                })?;
            drop(bytes);
            if let Some(cache) = &cache
                && let Err(e) = cache.store(&key, &component)
            {
                tracing::warn!(error = %e, "could not cache the compiled plugin");
            }
            Ok::<_, LoadError>((component, Origin::Compiled { in_child }))
        });
        let (component, origin) = task.await.map_err(|source| LoadError::CompileTask {
            path: rel.to_path_buf(),
            source,
        })??;
        let elapsed = started.elapsed();
        match origin {
            Origin::Disk => {
                tracing::info!(path = %rel.display(), digest, ?elapsed, "plugin loaded from the precompiled cache, not compiled");
                self.inner.disk_hits.fetch_add(1, Ordering::Relaxed);
            }
            Origin::Compiled { in_child } => {
                tracing::info!(path = %rel.display(), digest, ?elapsed, in_child, "plugin compiled");
                self.inner.compiled.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(component)
    }
}

/// Where a loaded component came from.
enum Origin {
    /// The authenticated disk cache.
    Disk,
    /// A compile, in a child process or in this one.
    Compiled { in_child: bool },
}
