//! Change detection: re-reading loaded paths whose files changed, periodically or on demand,
//! and announcing each swap or failure as a [`PluginEvent`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use super::files::FileStamp;
use super::{Inner, LoadError, PluginRegistry};
use crate::component::Plugin;
use crate::report::chain;

/// A path's plugin was swapped or stopped being served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginEvent {
    /// Relative to the plugin directory, as passed to [`PluginRegistry::load`].
    pub path: PathBuf,
    /// The digest now served, or `None` when the new file failed to load (`error` says why).
    pub digest: Option<String>,
    pub error: Option<String>,
}

impl PluginEvent {
    pub(super) fn swapped(path: &Path, plugin: &Plugin) -> Self {
        PluginEvent {
            path: path.to_path_buf(),
            digest: Some(plugin.digest().to_string()),
            error: None,
        }
    }

    fn failed(path: PathBuf, error: &LoadError) -> Self {
        PluginEvent {
            path,
            digest: None,
            error: Some(chain(error)),
        }
    }
}

impl PluginRegistry {
    /// Swaps and failures of loaded paths, as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.inner.events.subscribe()
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
                Ok((plugin, _)) if plugin.digest() != digest => {
                    events.push(PluginEvent::swapped(&rel, &plugin));
                }
                Ok(_) => {}
                Err(e) => {
                    let mut tables = self.tables();
                    tables.by_path.remove(&rel);
                    tables.forget_unserved();
                    drop(tables);
                    let event = PluginEvent::failed(rel, &e);
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
}
