//! One call into a plugin: a fresh Store, bounded in memory and time, thrown away afterwards.
//!
//! # Guarantees
//!
//! - No state survives a call: every call instantiates the pre-linked component in a new Store
//!   (with new WASI, HTTP and resource tables), so calls of different VMs or tenants share
//!   nothing, and a trap never poisons a later call.
//! - Every call ends within [`CallLimits::timeout`] plus one epoch tick: a guest computing is
//!   stopped by the epoch callback, a guest blocked in a host call by a tokio timeout around
//!   the whole call (both report [`CallError::Timeout`]). Waiting for an instance slot counts
//!   against the same limit ([`CallError::Instantiate`], a host fault, when none came free).
//! - Each linear memory is capped at [`CallLimits::memory_bytes`]; growing past it fails the
//!   call with [`CallError::MemoryLimit`].
//! - Any guest behaviour ends as a `Result`, never a host panic; busy guests yield to the
//!   runtime every epoch tick, so they cannot starve other calls on the same worker.
//! - Guest stdout/stderr and `log` lines reach the host's log tagged with
//!   [`CallContext::label`], bounded per call.
//! - Every answer is checked against the WIT bounds ([`super::bounds`]) before it is returned;
//!   one over a bound is [`CallError::ContractViolation`] and its content is dropped.
//! - Every Secret value the host knows is replaced by `[redacted]` in the text of the answer
//!   and of the error before either is logged or returned; identity (a machine's id and owner,
//!   a location) is never rewritten ([`super::redact`]; `tests/tests/sandbox/redaction.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wasmtime::{Store, Trap, UpdateDeadline};

use super::bindings;
use super::bounds::{self, Violation};
use super::egress::{EgressHooks, EgressPolicy, NetTrace};
use super::engine::{PluginEngine, WasmError};
use super::exports::{Answer, Export, Guest};
use super::output::CapturedOutput;
use super::redact::Redactor;
use super::state::{MAX_CAPTURED_OUTPUT, MemoryCapExceeded, State};
use super::types::{ErrorClass, Fault, ProviderError, ProviderSettings};

/// Bounds on one call, from `ProviderConfig.spec.limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Wall-clock limit of the whole call (instantiation included).
    pub timeout: Duration,
    /// Cap of each linear memory of the instance.
    pub memory_bytes: usize,
    /// Largest HTTP response body the guest may receive.
    pub max_response_bytes: u64,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            timeout: Duration::from_secs(30),
            memory_bytes: 128 << 20,
            max_response_bytes: 8 << 20,
        }
    }
}

/// Everything a call needs besides its arguments.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub settings: ProviderSettings,
    pub egress: EgressPolicy,
    pub limits: CallLimits,
    /// Who the call is for in logs: the ProviderConfig's name.
    pub label: String,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The provider answered with an error (from the cloud, or about the spec/credentials).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The guest trapped (panic, unreachable, stack overflow, ...) or a host function it called
    /// failed fatally.
    #[error("plugin trapped during {op}")]
    Trap {
        op: &'static str,
        #[source]
        source: WasmError,
    },
    /// The call ran past its time limit, computing or blocked in a host call.
    #[error("plugin call {op} exceeded its time limit of {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
    /// The guest tried to grow a memory past the cap.
    #[error("plugin call {op} exceeded its memory cap of {cap} bytes")]
    MemoryLimit { op: &'static str, cap: usize },
    /// The plugin answered outside the contract's bounds (`wit/provider.wit`); nothing of the
    /// answer is kept.
    #[error("plugin answer to {op} broke the contract")]
    ContractViolation {
        op: &'static str,
        #[source]
        violation: Violation,
    },
    /// The host could not set up the call: no instance slot came free within the time limit,
    /// or instantiation failed.
    #[error("failed to instantiate the plugin for {op}")]
    Instantiate {
        op: &'static str,
        #[source]
        source: WasmError,
    },
}

impl CallError {
    /// This error with the plugin's words redacted. Traps, timeouts and memory errors carry no
    /// plugin text (a guest's panic message goes to its stderr, which is redacted there).
    pub fn redacted(self, redactor: &Redactor) -> CallError {
        match self {
            CallError::Provider(e) => CallError::Provider(redactor.provider_error(e)),
            other => other,
        }
    }

    /// What the controller should do next. A misbehaving guest is transient for that VM: the
    /// call is retried with backoff, and a fixed plugin file is picked up on reload.
    pub fn class(&self) -> ErrorClass {
        match self {
            CallError::Provider(e) => ErrorClass::from(e),
            CallError::Trap { .. }
            | CallError::Timeout { .. }
            | CallError::MemoryLimit { .. }
            | CallError::ContractViolation { .. }
            | CallError::Instantiate { .. } => ErrorClass::Transient,
        }
    }

    /// The `Synced` condition reason: the class's, except that a broken contract says so.
    pub fn reason(&self) -> &'static str {
        match self {
            CallError::ContractViolation { .. } => "PluginContractViolation",
            other => other.class().reason(),
        }
    }

    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        match self {
            CallError::Provider(_) => Fault::Provider,
            CallError::Trap { .. }
            | CallError::Timeout { .. }
            | CallError::MemoryLimit { .. }
            | CallError::ContractViolation { .. } => Fault::Plugin,
            CallError::Instantiate { .. } => Fault::Host,
        }
    }
}

/// Raised by the epoch callback once the call's deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("call deadline reached")]
struct DeadlineReached;

/// Runs `export` in a fresh Store. See the module docs for what is guaranteed.
pub(crate) async fn call<E: Export>(
    engine: &PluginEngine,
    pre: &bindings::Pre,
    ctx: &CallContext,
    export: E,
) -> Result<E::Answer, CallError> {
    call_traced(engine, pre, ctx, export).await.0
}

/// [`call`], also saying whether any HTTP request of the call may have reached a server
/// (`false` is a proof that nothing was sent: see [`NetTrace`]).
pub(crate) async fn call_traced<E: Export>(
    engine: &PluginEngine,
    pre: &bindings::Pre,
    ctx: &CallContext,
    export: E,
) -> (Result<E::Answer, CallError>, bool) {
    let trace = NetTrace::default();
    let op = E::OP.as_str();
    let limits = ctx.limits;
    let started = Instant::now();
    let deadline = started + limits.timeout;
    let stdout = CapturedOutput::new(MAX_CAPTURED_OUTPUT);
    let stderr = CapturedOutput::new(MAX_CAPTURED_OUTPUT);
    let memory_cap = engine.memory_cap(limits.memory_bytes);

    let has_slot = AtomicBool::new(false);
    let run = async {
        let Some(_slot) = engine.slot().await else {
            return Err(CallError::Instantiate {
                op,
                source: "the plugin engine is shutting down".into(),
            });
        };
        has_slot.store(true, Ordering::Relaxed);
        let hooks = EgressHooks::new(
            ctx.egress.clone(),
            deadline,
            limits.max_response_bytes,
            ctx.label.clone(),
            trace.clone(),
        );
        let state = State::new(hooks, memory_cap, deadline, stdout.clone(), stderr.clone());
        let mut store = Store::new(engine.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|store| {
            if Instant::now() >= store.data().deadline {
                Err(wasmtime::Error::new(DeadlineReached))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let result = match pre.instantiate(&mut store).await {
            Ok(plugin) => {
                export
                    .invoke(Guest::new(&plugin, &mut store, &ctx.settings))
                    .await
            }
            // A memory cap or deadline hit while the guest initialises is still the guest's.
            Err(e) if !store.data().limiter.hit && !e.is::<DeadlineReached>() => {
                return Err(CallError::Instantiate {
                    op,
                    source: e.into(),
                });
            }
            Err(e) => Err(e),
        };
        let dropped_logs = store.data().log.dropped;
        if dropped_logs > 0 {
            tracing::warn!(provider = %store.data().label(), op, dropped = dropped_logs, "plugin log lines dropped past the per-call limit");
        }
        let answer =
            result.map_err(|e| classify(e, op, limits.timeout, memory_cap, store.data()))?;
        match &answer {
            Ok(answer) => answer.check(),
            Err(error) => bounds::error(error),
        }
        .map_err(|violation| CallError::ContractViolation { op, violation })?;
        answer.map_err(CallError::Provider)
    };
    let result = match tokio::time::timeout(limits.timeout, run).await {
        Ok(result) => result,
        Err(_elapsed) if !has_slot.load(Ordering::Relaxed) => Err(CallError::Instantiate {
            op,
            source: format!("no instance slot became free within {:?}", limits.timeout).into(),
        }),
        Err(_elapsed) => Err(CallError::Timeout {
            op,
            timeout: limits.timeout,
        }),
    };
    // Before anything of it is logged or returned: a plugin must not be able to echo a
    // credential into logs, status or Events.
    let redactor = ctx.egress.redactor();
    let result = match result {
        Ok(answer) => Ok(answer.redact(redactor)),
        Err(e) => Err(e.redacted(redactor)),
    };
    forward_output(&ctx.label, op, "stdout", &stdout);
    forward_output(&ctx.label, op, "stderr", &stderr);
    match &result {
        Ok(_) => {
            tracing::debug!(provider = %ctx.label, op, elapsed = ?started.elapsed(), "plugin call done")
        }
        Err(e @ CallError::Provider(_)) => {
            tracing::debug!(provider = %ctx.label, op, error = %e, "plugin call returned an error")
        }
        Err(e) => {
            tracing::warn!(provider = %ctx.label, op, error = %e, fault = ?e.fault(), "plugin call failed")
        }
    }
    (result, trace.reached())
}

fn classify(
    error: wasmtime::Error,
    op: &'static str,
    timeout: Duration,
    memory_cap: usize,
    state: &State,
) -> CallError {
    if state.limiter.hit || error.is::<MemoryCapExceeded>() {
        CallError::MemoryLimit {
            op,
            cap: memory_cap,
        }
    } else if error.is::<DeadlineReached>()
        || matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt))
    {
        CallError::Timeout { op, timeout }
    } else {
        CallError::Trap {
            op,
            source: error.into(),
        }
    }
}

fn forward_output(label: &str, op: &str, stream: &str, output: &CapturedOutput) {
    let (text, dropped) = output.take();
    if !text.is_empty() {
        tracing::info!(provider = %label, op, stream, output = %text.trim_end(), "plugin output");
    }
    if dropped > 0 {
        tracing::warn!(provider = %label, op, stream, dropped, "plugin output past the per-call limit dropped");
    }
}
