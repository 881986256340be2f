//! The watches the controllers run on: kube's watcher, made to start over with a fresh list
//! when the API server no longer serves the resourceVersion it resumes from, and retried on a
//! short backoff.
//!
//! kube's watcher treats a `410 Gone` that arrives *inside* a watch stream as a desync and
//! relists, but a `410` answering the request that (re)starts a watch only makes it retry the
//! same stale resourceVersion, backing off up to 30 s each time. That is what a restarted
//! kube-apiserver answers (its new watch cache starts at the current revision): VMs waited
//! about 80 s after the API server was back. Here such an error drops the
//! watcher for a new one, which lists again, and retries are capped at [`MAX_RETRY`]. The
//! desync itself is not passed on: it is handled, and a kube `Controller` backs off all its
//! triggers on every error it reads (so the controllers also get [`ShortBackoff`] as their
//! trigger backoff).
//!
//! # Guarantees
//!
//! - After a `410` on watch start, the next item is the start of a fresh list (`Init`), not
//!   the error, so the reflector swaps in the API server's current state (test:
//!   `relist::tests`; end to end `tests/tests/faults/operator_faults.rs`
//!   `converges_within_seconds_of_an_apiserver_restart`).
//! - While the API server is unreachable, attempts are at most [`MAX_RETRY`] apart.

use std::fmt::Debug;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::api::{SlimVirtualMachine, VirtualMachine};
use crate::controller::runtime::backoff::jitter;

const FIRST_RETRY: Duration = Duration::from_millis(250);
/// Longest wait between two attempts to reach the API server.
pub const MAX_RETRY: Duration = Duration::from_secs(4);

/// Doubling from [`FIRST_RETRY`] to [`MAX_RETRY`], jittered, reset by the first success.
#[derive(Debug, Clone)]
pub struct ShortBackoff {
    next: Duration,
}

impl Default for ShortBackoff {
    fn default() -> Self {
        ShortBackoff { next: FIRST_RETRY }
    }
}

impl Iterator for ShortBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(MAX_RETRY);
        Some(jitter(now, 0.2).min(MAX_RETRY))
    }
}

impl Backoff for ShortBackoff {
    fn reset(&mut self) {
        self.next = FIRST_RETRY;
    }
}

/// Whether this error means the resourceVersion the watcher holds is gone.
pub fn is_desync(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        watcher::Error::WatchError(status) => status.code == 410,
        _ => false,
    }
}

/// A watch of `api` that relists after a desync (see the module docs).
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    relisting(starter(api, config), None::<watch::Receiver<()>>)
}

/// [`watch`], started over with a fresh list each time `restart` changes: what `api`'s
/// client asks for follows `restart` (`sharding::scoped_client`), and a running watch keeps
/// what it asked for when it started. The reflector swaps in each new list whole, so objects
/// no longer asked for leave the cache and new ones enter it (test:
/// `a_change_of_restart_starts_a_new_list`).
pub fn watch_restarting<K, R>(
    api: Api<K>,
    config: watcher::Config,
    restart: watch::Receiver<R>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    R: Send + Sync + 'static,
{
    relisting(starter(api, config), Some(restart))
}

/// Starts one watch of `api`: slimmed objects, retried on [`ShortBackoff`].
fn starter<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Fn() -> BoxStream<'static, Result<Event<K>, watcher::Error>> + Clone + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    move || {
        watcher(api.clone(), config.clone())
            .modify(slim)
            .backoff(ShortBackoff::default())
            .boxed()
    }
}

/// A VM watch event with the object as the rest of the operator holds it; the watch reads
/// [`SlimVirtualMachine`] so that managed fields are never parsed.
pub fn unwrap_slim(event: Event<SlimVirtualMachine>) -> Event<VirtualMachine> {
    match event {
        Event::Apply(vm) => Event::Apply(vm.0),
        Event::Delete(vm) => Event::Delete(vm.0),
        Event::Init => Event::Init,
        Event::InitApply(vm) => Event::InitApply(vm.0),
        Event::InitDone => Event::InitDone,
    }
}

/// kubectl's copy of the last applied object, as big as the object itself.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reconciler reads and the caches would otherwise hold for every object:
/// `managedFields` (often larger than the spec) and kubectl's last-applied copy. Writes are
/// unaffected: status goes through `/status`, which ignores metadata, an empty
/// `managedFields` in an update leaves the server's untouched, and metadata is only ever merge
/// patched, never PUT from a cached object, which would delete the user's copy (test:
/// `operator_lifecycle.rs` `the_operators_writes_keep_kubectls_last_applied_copy`).
fn slim<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The watch streams `start` makes, one after another: a desync ends one and starts the next
/// in its place, and is not passed on; so does a change of `restart` (while its sender lives).
fn relisting<T: Send + 'static, R: Send + Sync + 'static>(
    start: impl Fn() -> BoxStream<'static, Result<Event<T>, watcher::Error>> + Clone + Send + 'static,
    restart: Option<watch::Receiver<R>>,
) -> impl Stream<Item = Result<Event<T>, watcher::Error>> + Send {
    futures::stream::unfold((None, restart), move |(current, mut restart)| {
        let start = start.clone();
        async move {
            let mut inner = current.unwrap_or_else(&start);
            loop {
                let item = match restart.as_mut() {
                    None => inner.next().await?,
                    Some(changes) => tokio::select! {
                        item = inner.next() => item?,
                        changed = changes.changed() => {
                            if changed.is_ok() {
                                tracing::info!("what this watch asks for changed; listing again");
                                inner = start();
                            } else {
                                restart = None;
                            }
                            continue;
                        }
                    },
                };
                if matches!(&item, Err(e) if is_desync(e)) {
                    tracing::info!(
                        "the API server no longer has the watched resourceVersion; listing again"
                    );
                    inner = start();
                    continue;
                }
                return Some((item, (Some(inner), restart)));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            Status::failure("too old resource version", "Expired")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn gone_on_watch_start_is_a_desync() {
        assert!(is_desync(&watcher::Error::WatchStartFailed(api_error(410))));
        assert!(is_desync(&watcher::Error::WatchError(
            Status::failure("gone", "Expired").with_code(410).boxed()
        )));
        assert!(!is_desync(&watcher::Error::WatchStartFailed(api_error(
            500
        ))));
        assert!(!is_desync(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn cached_objects_hold_no_managed_fields_and_no_last_applied_copy() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut cm = ConfigMap::default();
        cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        cm.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_owned(), "{...}".to_owned()),
                ("vmop.dev/paused".to_owned(), "true".to_owned()),
            ]
            .into(),
        );
        slim(&mut cm);
        assert_eq!(cm.metadata.managed_fields, None);
        assert_eq!(
            cm.metadata.annotations,
            Some([("vmop.dev/paused".to_owned(), "true".to_owned())].into())
        );
    }

    /// The first watch desyncs after one object; the second lists afresh.
    #[tokio::test]
    async fn a_desync_starts_a_fresh_list_and_is_not_passed_on() {
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = started.clone();
        let stream = relisting(
            move || {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let items: Vec<Result<Event<u32>, watcher::Error>> = if n == 0 {
                    vec![
                        Ok(Event::Init),
                        Ok(Event::InitDone),
                        Ok(Event::Apply(1)),
                        Err(watcher::Error::WatchStartFailed(api_error(410))),
                        Ok(Event::Apply(99)),
                    ]
                } else {
                    vec![
                        Ok(Event::Init),
                        Ok(Event::InitApply(2)),
                        Ok(Event::InitDone),
                    ]
                };
                futures::stream::iter(items).boxed()
            },
            None::<watch::Receiver<()>>,
        );
        let seen: Vec<String> = stream.map(shown).collect().await;
        assert_eq!(
            seen,
            [
                "init",
                "init-done",
                "apply 1",
                "init",
                "init-apply 2",
                "init-done"
            ]
        );
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    fn shown(item: Result<Event<u32>, watcher::Error>) -> String {
        match item {
            Ok(Event::Init) => "init".to_owned(),
            Ok(Event::InitApply(n)) => format!("init-apply {n}"),
            Ok(Event::InitDone) => "init-done".to_owned(),
            Ok(Event::Apply(n)) => format!("apply {n}"),
            Ok(Event::Delete(n)) => format!("delete {n}"),
            Err(e) => format!("error {e}"),
        }
    }

    /// Each watch lists the object numbered after it, then waits forever.
    #[tokio::test]
    async fn a_change_of_restart_starts_a_new_list() {
        let (tx, rx) = watch::channel(0u32);
        let started = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = started.clone();
        let stream = relisting(
            move || {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let items = vec![
                    Ok(Event::Init),
                    Ok(Event::InitApply(n)),
                    Ok(Event::InitDone),
                ];
                futures::stream::iter(items)
                    .chain(futures::stream::pending())
                    .boxed()
            },
            Some(rx),
        );
        let mut stream = Box::pin(stream.map(shown));
        let mut next_three = async || {
            let mut seen = Vec::new();
            for _ in 0..3 {
                seen.extend(stream.next().await);
            }
            seen
        };
        assert_eq!(next_three().await, ["init", "init-apply 0", "init-done"]);
        tx.send_replace(1);
        assert_eq!(next_three().await, ["init", "init-apply 1", "init-done"]);
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn backoff_is_short_and_resets() {
        let mut b = ShortBackoff::default();
        let delays: Vec<Duration> = (0..8).filter_map(|_| b.next()).collect();
        assert!(delays.iter().all(|d| *d <= MAX_RETRY));
        assert!(delays.last() > delays.first());
        b.reset();
        assert!(b.next() <= Some(FIRST_RETRY.mul_f64(1.2)));
    }
}
