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

use futures::channel::mpsc::UnboundedSender;
use http::Request;
use http::uri::PathAndQuery;
use kube::ResourceExt;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use super::error::Error;
use super::index::VmIndex;
use crate::api::{ProviderConfig, VirtualMachine};
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
    let Some(mut held) = shards.holding(shard(shards)) else {
        return Ok(Action::await_change());
    };
    tokio::select! {
        result = reconcile => result,
        _ = held.wait_for(|holding| !*holding) => Ok(Action::await_change()),
    }
}

/// The shard of a VM.
pub fn vm_shard(vm: &VirtualMachine) -> impl FnOnce(&Shards) -> u32 + '_ {
    move |shards| shard_of(vm.uid().as_deref().unwrap_or_default(), shards.count())
}

/// What the shard task is told and asks: [`on_acquired`]; the VMs per ProviderConfig of the
/// held shards, from `index`; and a changed total requeues its ProviderConfig.
pub fn hooks(
    vms: Store<VirtualMachine>,
    configs: Store<ProviderConfig>,
    index: Arc<VmIndex>,
    vm_tx: UnboundedSender<ObjectRef<VirtualMachine>>,
    pc_tx: UnboundedSender<ObjectRef<ProviderConfig>>,
    count: u32,
) -> Hooks {
    Hooks {
        on_acquired: on_acquired(vms, configs, vm_tx, pc_tx.clone(), count),
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
    configs: Store<ProviderConfig>,
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
            for pc in configs.state() {
                let _ = pc_tx.unbounded_send(ObjectRef::from(&*pc));
            }
        }
    })
}

/// `client`, adding the shard selector of the shards `held` says, read at each request, to every
/// list and watch of VirtualMachines. A watch that is not restarted when `held` changes keeps
/// what it was started with; `relist::watch_restarting` restarts it.
pub fn scoped_client(
    client: kube::Client,
    held: watch::Receiver<BTreeSet<u32>>,
    count: u32,
) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let client = client.clone();
        add_selector(&mut request, &shard_selector(&held.borrow(), count));
        async move { client.send(request).await }
    });
    kube::Client::new(service, namespace)
}

/// Appends `shardSelector=<selector>` to a GET of a VirtualMachine collection (a list or a
/// watch; a GET of one VM ends in its name).
fn add_selector(request: &mut Request<Body>, selector: &str) {
    let uri = request.uri();
    if request.method() != http::Method::GET || !uri.path().ends_with("/virtualmachines") {
        return;
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
        return;
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query);
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
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
            add_selector(&mut r, selector);
            let got = r.uri().to_string();
            match want {
                Some(prefix) => assert_eq!(got, format!("{prefix}{encoded}")),
                None => assert_eq!(got, uri),
            }
        }
    }
}
