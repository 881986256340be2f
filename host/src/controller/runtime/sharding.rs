//! The controllers' side of [`crate::leader::shards`]: reconcile a VM only while holding its
//! shard (ProviderConfigs: shard 0), drop the reconcile the moment the shard is lost, and
//! reconcile a shard's objects as soon as it is acquired (they were skipped meanwhile).
//!
//! The VM watch asks the API server for the held shards' VMs only ([`scoped_client`]): an API
//! server with the `ShardedListAndWatch` feature (KEP-5866, alpha since Kubernetes 1.36) then
//! sends each replica its own VMs instead of all of them, and one without it ignores the
//! selector. Ownership never rests on the selector: a VM outside the held shards that reaches
//! the cache anyway is skipped by [`while_holding`] and not counted. A ProviderConfig's
//! `vmCount` is the sum of what each replica counts in its shards ([`hooks`],
//! [`crate::leader::shards::COUNTS_ANNOTATION`]), so no replica needs every VM.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::channel::mpsc::UnboundedSender;
use http::Request;
use http::uri::PathAndQuery;
use kube::ResourceExt;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::api::{ProviderConfig, VirtualMachine};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::leader::shards::{Hooks, OnAcquired, Shards, shard_of, shard_selector};

/// The shard that reconciles ProviderConfigs (their status is one object for all VMs).
pub const PROVIDER_CONFIG_SHARD: u32 = 0;

/// Runs `reconcile` if this replica holds `shard`, and for as long as it does. Not holding it
/// (or losing it midway) answers "await change": the shard's holder reconciles the object,
/// and [`on_acquired`] requeues it here should this replica take the shard over.
pub async fn while_holding(
    shards: Option<&Shards>,
    shard: impl FnOnce(&Shards) -> u32,
    reconcile: impl Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    let Some(shards) = shards else {
        return reconcile.await;
    };
    let Some(mut holding) = shards.holding(shard(shards)) else {
        return Ok(Action::await_change());
    };
    // The hold is dropped after the reconcile: a hand-over of the shard waits for both.
    // Loss first: a process resuming from a freeze polls this before the reconcile acts.
    tokio::select! {
        biased;
        () = holding.lost() => Ok(Action::await_change()),
        result = reconcile => result,
    }
}

/// The shard of a VM.
pub fn vm_shard(vm: &VirtualMachine) -> impl FnOnce(&Shards) -> u32 + '_ {
    move |shards| shard_of(vm.uid().as_deref().unwrap_or_default(), shards.count())
}

/// What the shard task is told and asks: [`on_acquired`]; the VMs per ProviderConfig of the
/// held shards, from the index; and a changed total requeues its ProviderConfig.
pub fn hooks(
    vms: Store<VirtualMachine>,
    ctx: Arc<Context>,
    vm_tx: UnboundedSender<ObjectRef<VirtualMachine>>,
    pc_tx: UnboundedSender<ObjectRef<ProviderConfig>>,
    count: u32,
) -> Hooks {
    let index = ctx.index.clone();
    let acquiring = ctx.clone();
    Hooks {
        // Another replica held the shard and may have made creates this one does not know of.
        on_acquiring: Arc::new(move |shard| acquiring.attempts.acquired(shard, count)),
        on_acquired: on_acquired(vms, ctx, vm_tx, pc_tx.clone(), count),
        count_held: Arc::new(move |held| {
            index.counts_where(|uid| held.contains(&shard_of(uid, count)))
        }),
        on_totals: Arc::new(move |names| {
            for name in names {
                // A closed channel means the controller stopped: nothing left to requeue.
                let _ = pc_tx.unbounded_send(ObjectRef::new(&name));
            }
        }),
    }
}

/// Requeues the VMs of an acquired shard (and every ProviderConfig with shard 0).
fn on_acquired(
    vms: Store<VirtualMachine>,
    ctx: Arc<Context>,
    vm_tx: UnboundedSender<ObjectRef<VirtualMachine>>,
    pc_tx: UnboundedSender<ObjectRef<ProviderConfig>>,
    count: u32,
) -> OnAcquired {
    Arc::new(move |shard| {
        for vm in vms.state() {
            if shard_of(vm.uid().as_deref().unwrap_or_default(), count) == shard {
                // A closed channel means the controller stopped: nothing left to requeue.
                let _ = vm_tx.unbounded_send(ObjectRef::from(&*vm));
            }
        }
        if shard == PROVIDER_CONFIG_SHARD {
            for pc in ctx.resolver.configs.state() {
                let _ = pc_tx.unbounded_send(ObjectRef::from(&*pc));
            }
        }
    })
}

/// `client`, adding the shard selector of the shards `held` says, read at each request, to every
/// list and watch of VirtualMachines. A watch that is not restarted when `held` changes keeps
/// what it was started with; `relist::watch_restarting` restarts it. An API server that
/// answers 400 to a request with the selector (a later version of an alpha API) gets that
/// request again without it, and no selector after that, with a warning: the replica then
/// watches every VM, as before server-side sharding (`a_refused_selector_is_dropped_for_good`).
pub fn scoped_client(
    client: kube::Client,
    held: watch::Receiver<BTreeSet<u32>>,
    count: u32,
) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let refused = Arc::new(AtomicBool::new(false));
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let client = client.clone();
        let refused = refused.clone();
        // Without the selector, to send again should the API server refuse it.
        let plain = (
            request.method().clone(),
            request.uri().clone(),
            request.headers().clone(),
        );
        let scoped = !refused.load(Ordering::Relaxed)
            && add_selector(&mut request, &shard_selector(&held.borrow(), count));
        async move {
            let response = client.send(request).await?;
            if !scoped || response.status() != http::StatusCode::BAD_REQUEST {
                return Ok(response);
            }
            refused.store(true, Ordering::Relaxed);
            tracing::warn!(
                "the API server refused the VM watch's shard selector; watching every VM from now \
                 on (each is still reconciled only by the holder of its shard)"
            );
            let (method, uri, headers) = plain;
            let mut retry = Request::new(Body::empty());
            *retry.method_mut() = method;
            *retry.uri_mut() = uri;
            *retry.headers_mut() = headers;
            client.send(retry).await
        }
    });
    kube::Client::new(service, namespace)
}

/// Appends `shardSelector=<selector>` to a GET of a VirtualMachine collection (a list or a
/// watch; a GET of one VM ends in its name); says whether it did.
fn add_selector(request: &mut Request<Body>, selector: &str) -> bool {
    let uri = request.uri();
    if request.method() != http::Method::GET || !uri.path().ends_with("/virtualmachines") {
        return false;
    }
    let mut query = uri.query().unwrap_or_default().to_owned();
    if !query.is_empty() {
        query.push('&');
    }
    query.push_str("shardSelector=");
    for byte in selector.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            query.push(char::from(byte));
        } else {
            query.push_str(&format!("%{byte:02X}"));
        }
    }
    let Ok(path_and_query) = PathAndQuery::try_from(format!("{}?{query}", uri.path())) else {
        return false;
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query);
    let Ok(uri) = http::Uri::from_parts(parts) else {
        return false;
    };
    *request.uri_mut() = uri;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: http::Method, uri: &str) -> Request<Body> {
        let mut request = Request::new(Body::empty());
        *request.method_mut() = method;
        *request.uri_mut() = uri.parse().unwrap_or_default();
        request
    }

    #[test]
    fn only_lists_and_watches_of_vms_carry_the_selector() {
        let selector = "shardRange(object.metadata.uid,'0x0','0x8')||x";
        let encoded = "shardRange%28object.metadata.uid%2C%270x0%27%2C%270x8%27%29%7C%7Cx";
        for (method, uri, want) in [
            (
                http::Method::GET,
                "/apis/vmop.dev/v1alpha1/virtualmachines?&watch=true&resourceVersion=5",
                Some(
                    "/apis/vmop.dev/v1alpha1/virtualmachines?&watch=true&resourceVersion=5&shardSelector=",
                ),
            ),
            (
                http::Method::GET,
                "/apis/vmop.dev/v1alpha1/namespaces/a/virtualmachines",
                Some("/apis/vmop.dev/v1alpha1/namespaces/a/virtualmachines?shardSelector="),
            ),
            (
                http::Method::GET,
                "/apis/vmop.dev/v1alpha1/namespaces/a/virtualmachines/vm-1",
                None,
            ),
            (
                http::Method::POST,
                "/apis/vmop.dev/v1alpha1/namespaces/a/virtualmachines",
                None,
            ),
            (http::Method::GET, "/api/v1/configmaps?&watch=true", None),
        ] {
            let mut r = request(method, uri);
            assert_eq!(add_selector(&mut r, selector), want.is_some());
            let got = r.uri().to_string();
            match want {
                Some(prefix) => assert_eq!(got, format!("{prefix}{encoded}")),
                None => assert_eq!(got, uri),
            }
        }
    }

    #[tokio::test]
    async fn a_refused_selector_is_dropped_for_good() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let api_server = tower::service_fn(move |request: Request<Body>| {
            let uri = request.uri().to_string();
            let mut response = http::Response::new(Body::empty());
            if uri.contains("shardSelector") {
                *response.status_mut() = http::StatusCode::BAD_REQUEST;
            }
            log.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(uri);
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        let (_held, changes) = watch::channel(BTreeSet::from([1]));
        let client = scoped_client(kube::Client::new(api_server, "default"), changes, 3);
        for _ in 0..2 {
            let list = request(http::Method::GET, "/apis/vmop.dev/v1alpha1/virtualmachines");
            let response = client.send(list).await;
            assert_eq!(
                response.map(|r| r.status()).ok(),
                Some(http::StatusCode::OK)
            );
        }
        let seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let plain = "/apis/vmop.dev/v1alpha1/virtualmachines";
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(
            seen.first().is_some_and(|u| u.contains("shardSelector=")),
            "{seen:?}"
        );
        assert_eq!(
            seen.get(1..),
            Some(&[plain.to_owned(), plain.to_owned()][..])
        );
    }
}
