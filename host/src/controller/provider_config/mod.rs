//! The ProviderConfig reconciler: loads the plugin, resolves the credentials Secret and the
//! egress policy, and reports `Ready`, the plugin's identity and how many VMs use it.
//!
//! `Ready` says the configuration is usable, not that the credentials are accepted (a refused
//! call shows up as `Synced=False` on the VMs). Its only cloud calls are the listings of the
//! cloud view, for plugins that can `list` (`inventory.rs`): once per resync period.

mod inventory;
pub(crate) mod locations;
mod resolve;
pub mod view;

pub use resolve::{Provider, ResolveError, Resolver, apply_credentials};

use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use crate::api::conditions::{self, READY, Status};
use crate::api::{MANAGER, ParameterStatus, PluginStatus, ProviderConfig, ProviderConfigStatus};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::telemetry::events::chain;

pub async fn reconcile(pc: Arc<ProviderConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = pc.name_any();
    let generation = pc.meta().generation;
    let old = pc.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = generation;
    // Sharded, each replica caches and counts its own shards' VMs: the sum is over replicas.
    status.vm_count = match &ctx.shards {
        Some(shards) => shards.total(&name),
        None => u32::try_from(ctx.index.count(&name)).unwrap_or(u32::MAX),
    };
    let resolved = ctx.resolver.resolve(&pc).await;
    let ready = match &resolved {
        Ok(provider) => {
            status.credentials = Some(provider.credentials);
            let info = provider.plugin.info();
            status.plugin = Some(PluginStatus {
                name: info.name.clone(),
                version: info.version.clone(),
                digest: provider.plugin.digest().to_owned(),
                wit_version: info.wit_version.clone(),
                capabilities: info.capabilities.clone(),
                parameters: info
                    .parameters
                    .iter()
                    .map(|p| ParameterStatus {
                        name: p.name.clone(),
                        kind: p.kind.as_str().to_owned(),
                        description: p.description.clone(),
                        mutable: p.mutable,
                    })
                    .collect(),
            });
            // The digest says which build runs: a rollout of a new plugin image shows here and
            // in the PluginLoaded Event.
            let message = format!(
                "plugin {} {} loaded from {} (sha256:{})",
                info.name,
                info.version,
                pc.spec.plugin.path,
                provider.plugin.digest()
            );
            conditions::new(READY, Status::True, "PluginLoaded", message, generation)
        }
        Err(error) => {
            status.plugin = None;
            conditions::new(
                READY,
                Status::False,
                error.reason(),
                chain(error),
                generation,
            )
        }
    };
    let was_ready = conditions::find(&old.conditions, READY).cloned();
    // Another build of the plugin (a rollout) is news even when Ready stays True.
    let digest = |s: &ProviderConfigStatus| s.plugin.as_ref().map(|p| p.digest.clone());
    let new_build = digest(&status).is_some() && digest(&status) != digest(&old);
    let passthrough_now = status.credentials.is_some_and(|c| c.is_passthrough());
    let passthrough_before = old.credentials.is_some_and(|c| c.is_passthrough());
    let refreshed = match &resolved {
        Ok(provider) => inventory::refresh(&ctx, &pc, provider).await,
        Err(_) => None,
    };
    // Sharded, each replica judges only its own shards' orphans: the Event and the metric say
    // them per replica, and no replica's partial count is written.
    status.orphans = match (&ctx.shards, refreshed) {
        (None, Some(r)) => r.orphans.or(old.orphans),
        _ => None,
    };
    conditions::set(&mut status.conditions, ready.clone());
    write(&ctx, &pc, &old, &status).await?;

    if was_ready.as_ref().map(|c| (&c.status, &c.reason)) != Some((&ready.status, &ready.reason))
        || new_build
    {
        if ready.status == Status::True.as_str() {
            ctx.events
                .normal(&*pc, "Load", "PluginLoaded", ready.message.clone())
                .await;
        } else {
            ctx.events
                .warning(&*pc, "Load", &ready.reason, ready.message.clone())
                .await;
        }
    }

    if passthrough_now && !passthrough_before && pc.spec.credentials_secret_ref.is_some() {
        ctx.events
            .warning(
                &*pc,
                "Load",
                "CredentialsPassthrough",
                "spec.credentials is passthrough: the plugin receives the Secret's values; \
                 prefer aws-sigv4, bearer or header so that the host signs and the plugin holds no secret",
            )
            .await;
    }

    match resolved {
        Ok(_) => {
            ctx.pc_backoffs.reset(&ObjectRef::from(&*pc));
            Ok(refreshed.map_or_else(Action::await_change, |r| Action::requeue(r.again_in)))
        }
        Err(source) => Err(Error::Resolve {
            name,
            source: Box::new(source),
        }),
    }
}

async fn write(
    ctx: &Context,
    pc: &ProviderConfig,
    old: &ProviderConfigStatus,
    new: &ProviderConfigStatus,
) -> Result<(), Error> {
    if pc.status.is_some() && conditions::same(old, new) {
        return Ok(());
    }
    let api: Api<ProviderConfig> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "apiVersion": ProviderConfig::api_version(&()),
        "kind": ProviderConfig::kind(&()),
        "status": new,
    });
    api.patch_status(
        &pc.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube("write the ProviderConfig status"))?;
    Ok(())
}
