//! Plugin calls for one VM: each takes a permit of its ProviderConfig's limiter without
//! waiting (a throttled call is [`Error::Throttled`], and the VM is requeued for when its token
//! is due), is timed into the metrics and logged (target `vmop::provider_call`, naming the VM)
//! so calls can be counted.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::api::{RECONCILE_REQUESTED_AT, VirtualMachine, conditions};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::provider_config::Provider;
use crate::controller::runtime::limiter::Permit;
use crate::plugin::{CallError, Operation, Page, UpdateOutcome, VmSpec, VmStatus};
use crate::telemetry::metrics::CallOutcome;
use kube::ResourceExt;

/// The calls made for one VM (`namespace/name`) through one provider.
#[derive(Debug)]
pub struct Calls<'a> {
    pub ctx: &'a Context,
    pub provider: &'a Provider,
    pub vm: String,
    /// Permits taken so far in this reconcile (what a throttled attempt reserves for the next).
    pub taken: AtomicU32,
    /// This reconcile is the drift check of a settled VM ([`is_drift_check`]): its first call
    /// yields to callers waiting for a token (the limiter's routine calls). What follows that
    /// call acts on what it saw, and queues like any other.
    pub routine: bool,
}

/// Whether a reconcile of `vm` can only be a drift check: not being deleted, its machine
/// recorded and Ready for the current generation, and no reconcile requested.
pub fn is_drift_check(vm: &VirtualMachine) -> bool {
    let Some(status) = &vm.status else {
        return false;
    };
    let requested = vm.annotations().get(RECONCILE_REQUESTED_AT);
    vm.metadata.deletion_timestamp.is_none()
        && status.id.is_some()
        && status.observed_generation.is_some()
        && status.observed_generation == vm.metadata.generation
        && conditions::is_true(&status.conditions, conditions::READY)
        && requested == status.last_handled_reconcile_at.as_ref()
}

impl Calls<'_> {
    pub async fn location(&self) -> Result<String, Error> {
        self.call(Operation::Location, |p| p.plugin.location(&p.call))
            .await
    }

    pub async fn find(&self, uid: &str) -> Result<Option<VmStatus>, Error> {
        self.call(Operation::Find, |p| p.plugin.find(&p.call, uid))
            .await
    }

    /// `create`, and whether it may have reached the cloud (`false` proves nothing was sent:
    /// throttled here, refused by the egress policy, or no connection made).
    pub async fn create(&self, spec: &VmSpec) -> (Result<VmStatus, Error>, bool) {
        let op = Operation::Create;
        let _permit = match self.permit(op) {
            Ok(permit) => permit,
            Err(retry_after) => return (Err(Error::Throttled { op, retry_after }), false),
        };
        let started = Instant::now();
        let (result, reached) = self
            .provider
            .plugin
            .create_traced(&self.provider.call, spec)
            .await;
        if let Ok(machine) = &result {
            self.ctx.views.touch(&machine.id, started);
        }
        (self.record(op, result, started.elapsed()), reached)
    }

    pub async fn get(&self, id: &str) -> Result<Option<VmStatus>, Error> {
        self.call(Operation::Get, |p| p.plugin.get(&p.call, id))
            .await
    }

    pub async fn update(&self, id: &str, spec: &VmSpec) -> Result<UpdateOutcome, Error> {
        self.ctx.views.touch(id, Instant::now());
        self.call(Operation::Update, |p| p.plugin.update(&p.call, id, spec))
            .await
    }

    pub async fn start(&self, id: &str) -> Result<(), Error> {
        self.ctx.views.touch(id, Instant::now());
        self.call(Operation::Start, |p| p.plugin.start(&p.call, id))
            .await
    }

    pub async fn stop(&self, id: &str) -> Result<(), Error> {
        self.ctx.views.touch(id, Instant::now());
        self.call(Operation::Stop, |p| p.plugin.stop(&p.call, id))
            .await
    }

    pub async fn delete(&self, id: &str) -> Result<(), Error> {
        self.ctx.views.touch(id, Instant::now());
        self.call(Operation::Delete, |p| p.plugin.delete(&p.call, id))
            .await
    }

    /// One page of the ProviderConfig's machines (capability `list`).
    pub async fn list(&self, cursor: Option<String>) -> Result<Page, Error> {
        self.call(Operation::List, |p| {
            p.plugin.list(&p.call, cursor.as_deref())
        })
        .await
    }

    /// Machine `id` of the VM `uid` from the ProviderConfig's cloud view, for the first
    /// observation of a drift check only (see `provider_config::view` for when the view may
    /// answer); `None`: ask `get`.
    pub fn viewed(&self, id: &str, uid: &str, freshness: Duration) -> Option<VmStatus> {
        let first = self.taken.load(Ordering::Relaxed) == 0;
        (self.routine && first && self.ctx.options.cloud_view)
            .then(|| {
                let epoch = self.ctx.attempts.epoch_of(uid).into_std();
                self.ctx.views.machine(self.provider, id, freshness, epoch)
            })
            .flatten()
    }

    async fn call<'p, T, F>(
        &'p self,
        op: Operation,
        call: impl FnOnce(&'p Provider) -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, CallError>>,
    {
        let _permit = self
            .permit(op)
            .map_err(|retry_after| Error::Throttled { op, retry_after })?;
        let started = Instant::now();
        let result = call(self.provider).await;
        self.record(op, result, started.elapsed())
    }

    fn permit(&self, op: Operation) -> Result<Permit, Duration> {
        let taken = self.taken.load(Ordering::Relaxed);
        let permit = if op.writes() {
            self.provider.try_write_permit(&self.vm, taken)?
        } else if self.routine && taken == 0 {
            self.provider.try_routine_permit()?
        } else {
            self.provider.try_permit(&self.vm, taken)?
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        Ok(permit)
    }

    fn record<T>(
        &self,
        op: Operation,
        result: Result<T, CallError>,
        elapsed: Duration,
    ) -> Result<T, Error> {
        let provider = &self.provider.name;
        let outcome = CallOutcome::of(&result);
        self.ctx
            .metrics
            .provider_call(provider, op, outcome, elapsed);
        // Kept current by the calls themselves: it only changes while calls are made.
        let (budget, write_budget) = match (outcome == CallOutcome::RateLimited, op.writes()) {
            (true, true) => self.provider.write_throttled(),
            (true, false) => (self.provider.throttled(), self.provider.write_budget()),
            (false, _) => (self.provider.budget(), self.provider.write_budget()),
        };
        self.ctx.metrics.set_call_budget(provider, budget);
        if let Some(write_budget) = write_budget {
            self.ctx.metrics.set_write_budget(provider, write_budget);
        }
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.reason(),
        };
        tracing::debug!(
            target: "vmop::provider_call",
            provider = %provider,
            vm = %self.vm,
            op = op.as_str(),
            outcome,
            elapsed_ms = elapsed.as_millis() as u64,
            "provider call"
        );
        result.map_err(|source| Error::Call { op, source })
    }
}
