//! A watch of one object that is listening before the test acts: every version written after
//! [`History::start`] returns reaches [`History::until`], however briefly it lasted. A wait
//! started after the act cannot promise that: the operator may mirror an outside change and
//! correct it (a stopped machine it starts again) before that wait's first list, which then
//! shows only the corrected state.

use std::pin::Pin;

use anyhow::{Context as _, bail};
use futures::{Stream, StreamExt as _};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;

use super::DEADLINE;

type Events<K> = Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>>;

/// The versions of one object, from the moment [`History::start`] returned.
pub struct History<K> {
    name: String,
    events: Events<K>,
    /// The newest version seen (`None`: absent).
    last: Option<K>,
}

impl<K: std::fmt::Debug> std::fmt::Debug for History<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("name", &self.name)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl<K> History<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    /// Watches object `name` of `api` and returns once the watch has listed it (or its absence),
    /// so that what is written from now on is seen.
    pub async fn start(api: Api<K>, name: &str) -> anyhow::Result<Self> {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut history = History {
            name: name.to_owned(),
            events: watcher(api, config).default_backoff().boxed(),
            last: None,
        };
        tokio::time::timeout(DEADLINE, async {
            loop {
                if let watcher::Event::InitDone = history.next().await? {
                    return anyhow::Ok(());
                }
            }
        })
        .await
        .with_context(|| format!("the watch of {name} did not list it within {DEADLINE:?}"))??;
        Ok(history)
    }

    /// The first version from now on (or the one seen last, if it already does) that satisfies
    /// `condition`, within [`DEADLINE`]. A watch that has to list again (a failed request, or the API
    /// server ending it with "too old") may miss a version written meanwhile; a watch this
    /// short-lived is not expected to.
    pub async fn until(&mut self, what: &str, condition: impl Fn(&K) -> bool) -> anyhow::Result<K> {
        if let Some(last) = self.last.as_ref().filter(|k| condition(k)) {
            return Ok(last.clone());
        }
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                if let watcher::Event::Apply(k) | watcher::Event::InitApply(k) = self.next().await?
                    && condition(&k)
                {
                    return anyhow::Ok(k);
                }
            }
        })
        .await;
        match found {
            Ok(found) => found,
            Err(_) => bail!(
                "{} did not become {what} within {DEADLINE:?}; last seen: {:#?}",
                self.name,
                self.last
            ),
        }
    }

    /// The next event; a failed watch request is retried (with the watcher's backoff).
    async fn next(&mut self) -> anyhow::Result<watcher::Event<K>> {
        loop {
            let Ok(event) = self.events.next().await.context("the watch ended")? else {
                continue;
            };
            match &event {
                watcher::Event::Apply(k) | watcher::Event::InitApply(k) => {
                    self.last = Some(k.clone());
                }
                watcher::Event::Delete(_) => self.last = None,
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
            return Ok(event);
        }
    }
}
