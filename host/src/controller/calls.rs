//! Plugin calls for one VM: each waits for its ProviderConfig's limiter, is timed into the
//! metrics and logged (target `vmop::provider_call`, naming the VM) so calls can be counted.

use std::time::{Duration, Instant};

use super::context::Context;
use super::error::Error;
use super::provider::Provider;
use crate::plugin::{CallError, Operation, VmSpec, VmStatus};
use crate::telemetry::metrics::CallOutcome;

/// The calls made for one VM (`namespace/name`) through one provider.
#[derive(Debug)]
pub struct Calls<'a> {
    pub ctx: &'a Context,
    pub provider: &'a Provider,
    pub vm: String,
}

impl Calls<'_> {
    pub async fn create(&self, spec: &VmSpec) -> Result<VmStatus, Error> {
        let _permit = self.provider.permit().await;
        let started = Instant::now();
        let result = self.provider.plugin.create(&self.provider.call, spec).await;
        self.record(Operation::Create, result, started.elapsed())
    }

    pub async fn get(&self, id: &str) -> Result<Option<VmStatus>, Error> {
        let _permit = self.provider.permit().await;
        let started = Instant::now();
        let result = self.provider.plugin.get(&self.provider.call, id).await;
        self.record(Operation::Get, result, started.elapsed())
    }

    pub async fn delete(&self, id: &str) -> Result<(), Error> {
        let _permit = self.provider.permit().await;
        let started = Instant::now();
        let result = self.provider.plugin.delete(&self.provider.call, id).await;
        self.record(Operation::Delete, result, started.elapsed())
    }

    fn record<T>(
        &self,
        op: Operation,
        result: Result<T, CallError>,
        elapsed: Duration,
    ) -> Result<T, Error> {
        let provider = &self.provider.name;
        self.ctx
            .metrics
            .provider_call(provider, op, CallOutcome::of(&result), elapsed);
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.class().reason(),
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
