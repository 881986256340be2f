//! `vmop plan`: what the operator would do next for each VM, and why, computed by the same
//! [`decide`] the reconciler runs, answered with read-only plugin calls only (`location`,
//! `find`, `get`). Nothing is written, to the cloud or to the API server.
//!
//! # Guarantees
//!
//! - The action printed is the one `decide` returns for the same facts: there is no second
//!   decision procedure to disagree with the reconciler.
//! - Only [`Operation::writes`](crate::plugin::Operation::writes)`() == false` calls are made
//!   (test: `tests/tests/operator/plan.rs`, which compares moto's instances and the VMs'
//!   resourceVersions before and after a plan).
//! - The grace period is taken as over (an operator that has been running long), so a machine
//!   the cloud no longer shows is planned as `recreate`/`release`, what the operator will do
//!   once the grace period has passed.
//! - Orphans ([`orphan_rows`]): for every ProviderConfig whose plugin can `list`, one row per
//!   machine with this cluster's mark and the uid of no VirtualMachine, `orphaned` (reported)
//!   or, under `orphanPolicy: Delete` and past the grace period, `delete-orphan`; listed with
//!   `list` only, and judged by the same `provider_config::view::orphans` as the operator.

use std::collections::HashSet;
use std::time::Duration;

use kube::ResourceExt;
use serde::Serialize;

use super::attempts::Attempts;
use super::decide::{Action, Facts, Observed, Step, decide, restart_pending};
use super::effects::claimant;
use super::{facts, vm_spec};
use crate::api::{OrphanPolicy, VirtualMachine};
use crate::controller::provider_config::view;
use crate::controller::provider_config::{Provider, ResolveError, Resolver};
use crate::plugin::{CallError, Operation};
use crate::telemetry::events::chain;

/// One VM's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanRow {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    /// `nothing`, `create`, `adopt`, `update`, `restart`, `start`, `stop`, `recreate`,
    /// `delete`, `release`, `orphan`, `wait`, `paused`, `blocked`, or `unknown` when the
    /// provider could not be asked; for a machine of no VM (the row's name is the machine's
    /// id, its namespace empty), `orphaned` or `delete-orphan`.
    pub action: String,
    /// Why, in a sentence.
    pub reason: String,
}

impl PlanRow {
    /// Whether the operator would change anything.
    pub fn changes(&self) -> bool {
        !matches!(
            self.action.as_str(),
            "nothing" | "wait" | "paused" | "orphaned"
        )
    }
}

/// Why a VM could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot use ProviderConfig {name}")]
    Resolve {
        name: String,
        #[source]
        source: ResolveError,
    },
    #[error("provider call failed")]
    Call(#[source] CallError),
    #[error("the VirtualMachine is invalid")]
    Spec(#[source] crate::controller::error::Error),
}

/// Plans one VM (a VM not yet in the cluster has no uid: it would be created, or adopted).
/// `cluster` holds the cluster's VirtualMachines (which machines they record, for adoption).
pub async fn plan(resolver: &Resolver, vm: &VirtualMachine, cluster: &[VirtualMachine]) -> PlanRow {
    let provider_name = vm.spec.provider_config_ref.name.clone();
    let row = |action: &str, reason: String| PlanRow {
        namespace: vm.namespace().unwrap_or_default(),
        name: vm.name_any(),
        provider: provider_name.clone(),
        action: action.to_owned(),
        reason,
    };
    if vm.metadata.uid.is_none() {
        return match &vm.spec.external_id {
            Some(id) => row("adopt", format!("not in the cluster yet; would adopt {id}")),
            None => row("create", "not in the cluster yet".to_owned()),
        };
    }
    match decide_read_only(resolver, vm, cluster).await {
        Ok((Action::Observe(m), facts)) if restart_pending(&facts) => row(
            "wait",
            format!(
                "machine {} is {}; a change waits for a restart (RestartRequired; set \
                 powerState Stopped then Running, or updateStrategy Restart)",
                m.id,
                m.phase.as_str()
            ),
        ),
        Ok((action, _)) => {
            let (verb, reason) = describe(&action);
            row(verb, reason)
        }
        Err(e) => row("unknown", chain(&e)),
    }
}

async fn decide_read_only(
    resolver: &Resolver,
    vm: &VirtualMachine,
    cluster: &[VirtualMachine],
) -> Result<(Action, Facts), PlanError> {
    let name = &vm.spec.provider_config_ref.name;
    let provider = resolver
        .resolve_name(name)
        .await
        .map_err(|source| PlanError::Resolve {
            name: name.clone(),
            source,
        })?;
    let info = provider.plugin.info();
    let spec = vm_spec(vm, info).map_err(PlanError::Spec)?;
    let facts = {
        let mut f = facts(
            vm,
            &Attempts::settled(),
            provider.grace,
            Some((info, &spec)),
        );
        f.absence_wait = Duration::ZERO;
        f
    };
    let mut seen = Observed::default();
    loop {
        match decide(&facts, &seen) {
            Step::Get(id) => {
                seen.get = Some(call(&provider, |p| p.plugin.get(&p.call, &id)).await?)
            }
            Step::Find => {
                seen.find = Some(call(&provider, |p| p.plugin.find(&p.call, &spec.uid)).await?)
            }
            Step::Location => {
                seen.location = Some(call(&provider, |p| p.plugin.location(&p.call)).await?)
            }
            Step::Claimed(id) => seen.claimed_by = Some(claimant(cluster, &spec.uid, &id)),
            Step::Act(action) => return Ok((action, facts)),
        }
    }
}

async fn call<'p, T, F>(
    provider: &'p Provider,
    f: impl FnOnce(&'p Provider) -> F,
) -> Result<T, PlanError>
where
    F: Future<Output = Result<T, CallError>>,
{
    f(provider).await.map_err(PlanError::Call)
}

/// The orphans of every ProviderConfig whose plugin can `list` (see the module docs), among
/// the machines of `uids` (every VirtualMachine uid of the cluster); a ProviderConfig that
/// cannot be resolved or listed is one `unknown` row.
pub async fn orphan_rows(resolver: &Resolver, uids: &HashSet<String>) -> Vec<PlanRow> {
    let mut rows = Vec::new();
    let names: Vec<String> = resolver
        .configs
        .state()
        .iter()
        .map(|pc| pc.name_any())
        .collect();
    for name in names {
        let row = |name: &str, action: &str, reason: String| PlanRow {
            namespace: String::new(),
            name: name.to_owned(),
            provider: name.to_owned(),
            action: action.to_owned(),
            reason,
        };
        let provider = match resolver.resolve_name(&name).await {
            Ok(provider) => provider,
            Err(e) => {
                rows.push(row(&name, "unknown", chain(&e)));
                continue;
            }
        };
        if !provider.plugin.info().has("list") {
            continue;
        }
        let listed = view::list_all(provider.identity, |cursor| {
            let provider = &provider;
            async move {
                provider
                    .plugin
                    .list(&provider.call, cursor.as_deref())
                    .await
                    .map_err(|source| crate::controller::error::Error::Call {
                        op: Operation::List,
                        source,
                    })
            }
        })
        .await;
        let listing = match listed {
            Ok(listing) => listing,
            Err(e) => {
                rows.push(row(&name, "unknown", chain(&e)));
                continue;
            }
        };
        let policy = resolver
            .lookup(&name)
            .map(|pc| pc.spec.orphan_policy)
            .unwrap_or_default();
        let all: HashSet<String> = listing.machines.keys().cloned().collect();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // Seen "twice": a plan is the operator's next step after a listing that agreed.
        let found = view::orphans(
            &listing.machines,
            Some(&all),
            &resolver.cluster_id,
            uids,
            provider.grace,
            now_ms,
        );
        let mut ids: Vec<&String> = found.all.iter().collect();
        ids.sort();
        for id in ids {
            let owner = listing
                .machines
                .get(id)
                .and_then(|m| m.status.owner.clone())
                .unwrap_or_default();
            let deletable = found.deletable.contains(id);
            let (action, what) = match (policy, deletable) {
                (OrphanPolicy::Delete, true) => ("delete-orphan", "orphanPolicy Delete"),
                (OrphanPolicy::Delete, false) => ("orphaned", "inside the grace period or undated"),
                (OrphanPolicy::Report, _) => ("orphaned", "orphanPolicy Report"),
            };
            let mut r = row(
                id,
                action,
                format!(
                    "carries this cluster's mark and uid {owner}, which no VirtualMachine has ({what})"
                ),
            );
            r.provider = name.clone();
            rows.push(r);
        }
    }
    rows
}

/// The plan's words for an action.
fn describe(action: &Action) -> (&'static str, String) {
    match action {
        Action::Observe(m) => (
            "nothing",
            format!("machine {} is {}", m.id, m.phase.as_str()),
        ),
        Action::Create { location } | Action::Intend { location } => (
            "create",
            format!("no machine recorded; would create at {location}"),
        ),
        Action::Recreate { lost, location } => (
            "recreate",
            format!(
                "machine {lost} is gone (get and find agree); would create a new one at {location}"
            ),
        ),
        Action::Delete(id) => ("delete", format!("deleting: would delete machine {id}")),
        Action::AwaitDeletion(m) => ("wait", format!("machine {} is being deleted", m.id)),
        Action::Release => (
            "release",
            "deleting and no machine exists: would remove the finalizer".to_owned(),
        ),
        Action::Orphan => (
            "orphan",
            "deletionPolicy Orphan: would remove the finalizer and leave the machine".to_owned(),
        ),
        Action::AwaitAbsence { remaining } => (
            "wait",
            format!("not seen; waiting {remaining:?} before believing it"),
        ),
        Action::LocationChanged { recorded, current } => (
            "blocked",
            format!("made at {recorded}, the ProviderConfig now points at {current}"),
        ),
        Action::Paused => (
            "paused",
            "annotation vmop.dev/paused: no call, no change".to_owned(),
        ),
        Action::Adopt { machine, .. } => (
            "adopt",
            format!(
                "would adopt machine {} ({}) named by spec.externalId",
                machine.id,
                machine.phase.as_str()
            ),
        ),
        Action::AdoptionConflict { id, owner } => (
            "blocked",
            format!("machine {id} is managed by {owner}: never taken over"),
        ),
        Action::Disown { id, owner } => (
            "orphan",
            format!(
                "deleting: machine {id} carries the ownership mark of uid {owner}: would remove \
                 the finalizer and leave the machine"
            ),
        ),
        Action::LaunchOnly(changes) => (
            "blocked",
            format!(
                "{} changed, but the plugin applies it at creation only: refused (InvalidSpec)",
                changes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Action::NotFound { id: Some(id) } => ("blocked", format!("machine {id} does not exist")),
        Action::NotFound { id: None } => (
            "blocked",
            "no machine to observe (managementPolicy ObserveOnly never creates)".to_owned(),
        ),
        Action::Update(m) => (
            "update",
            format!(
                "machine {} differs from spec (cpu, memory or parameters): would update it",
                m.id
            ),
        ),
        Action::Stop {
            machine,
            restart: true,
        } => (
            "restart",
            format!(
                "an update of machine {} needs a restart (updateStrategy Restart): would stop, update, start",
                machine.id
            ),
        ),
        Action::Stop { machine, .. } => (
            "stop",
            format!(
                "machine {} is running, powerState is Stopped: would stop it",
                machine.id
            ),
        ),
        Action::Start(m) => (
            "start",
            format!(
                "machine {} is {}, powerState is Running: would start it",
                m.id,
                m.phase.as_str()
            ),
        ),
        Action::ReplacementRequired(m) => (
            "blocked",
            format!(
                "the spec's change needs a new machine; {} is not replaced",
                m.id
            ),
        ),
        Action::Unsupported {
            capability, what, ..
        } => (
            "blocked",
            format!("{what} needs plugin capability {capability:?}, which it lacks"),
        ),
    }
}
