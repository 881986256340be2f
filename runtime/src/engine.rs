//! The one wasmtime [`Engine`] of the process, its [`Linker`], the epoch ticker and the bound on
//! concurrent instances.
//!
//! # Allocation
//!
//! The pooling allocator (pre-reserved slots, copy-on-write memory images: the cheapest
//! instantiation) is used when the machine lets us reserve its address space; otherwise, or
//! when [`EngineConfig::pooling`] is off, the on-demand allocator. Either way at most
//! [`EngineConfig::max_instances`] instances exist at once: callers wait for a slot instead of
//! failing on pool exhaustion.
//!
//! # Pool sizing
//!
//! The pool's totals are `max_instances` × the per-component maxima (16 core instances, 4
//! memories, 16 tables), so `max_instances` calls of any component the engine accepts fit at
//! once: a Python component of 14 core instances no longer exhausts the pool at 36 calls
//! (`engine::tests::the_pool_fits_max_instances_of_the_largest_component`). The cost is
//! virtual address space only.
//!
//! # Memory budget
//!
//! One instance holds at most [`EngineConfig::max_memory_bytes`] of linear memory (the sum of
//! its memories, see `state.rs`) plus [`HOST_BYTES_PER_INSTANCE`] on the host side (a signed
//! request body, stacks, tables, resources); the process needs [`PROCESS_HEADROOM_BYTES`]
//! besides (runtime, caches, one compilation). [`EngineConfig::memory_budget`] is the sum, and
//! the Deployment's memory limit must be at least that for its `--max-plugin-instances`
//! (checked by tests/tests/sandbox/memory_budget.rs against deploy/ and the chart; see deploy/README.md).
//!
//! # Epochs
//!
//! A dedicated OS thread increments the epoch every [`EngineConfig::epoch_tick`] while a call
//! holds an instance slot, and sleeps (no wake-ups at all) while none does: an idle operator
//! costs no CPU here (test: `the_ticker_sleeps_while_no_call_runs`). It notices the last call
//! ending at its next tick; only the first call starting wakes it (test:
//! `only_the_first_call_and_the_stop_wake_the_ticker`). A thread rather than a
//! tokio task because a guest spinning on a runtime worker must not be able to starve the very
//! timer that stops it. Missed ticks are skipped, never replayed in a burst. The thread stops
//! when the [`PluginEngine`] is dropped.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::Linker;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings;
use super::state::State;

/// A wasmtime error as a `std::error::Error` source.
pub(crate) type WasmError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Instances alive at once (concurrent calls, including the `info()` call of a load).
    pub max_instances: u32,
    /// The largest memory cap any call may have; a call's own cap is clamped to it.
    pub max_memory_bytes: usize,
    /// Epoch period: the granularity of deadlines and how often a busy guest yields.
    pub epoch_tick: Duration,
    /// Try the pooling allocator (falls back to on-demand when unsupported).
    pub pooling: bool,
}

/// Host-side memory one instance may hold outside its linear memories: a request body buffered
/// for signing (8 MiB), fiber stacks, tables and resource-table entries, with margin.
pub const HOST_BYTES_PER_INSTANCE: u64 = 16 << 20;
/// Memory the operator needs besides plugin instances: its runtime and object caches (about
/// 60 MiB) and one compilation at a time (about 400 MiB for a Python or JavaScript plugin).
pub const PROCESS_HEADROOM_BYTES: u64 = 512 << 20;

impl EngineConfig {
    /// The most memory the process can need with this configuration (see the module docs).
    pub fn memory_budget(&self) -> u64 {
        let per_instance = u64::try_from(self.max_memory_bytes)
            .unwrap_or(u64::MAX)
            .saturating_add(HOST_BYTES_PER_INSTANCE);
        u64::from(self.max_instances)
            .saturating_mul(per_instance)
            .saturating_add(PROCESS_HEADROOM_BYTES)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_instances: 64,
            max_memory_bytes: 128 << 20,
            epoch_tick: Duration::from_millis(10),
            pooling: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("failed to create the wasmtime engine")]
    Create(#[source] WasmError),
    #[error("failed to link the host functions")]
    Link(#[source] WasmError),
    #[error("failed to start the epoch ticker thread")]
    Ticker(#[source] std::io::Error),
}

/// Engine, linker and instance slots shared by every plugin.
pub struct PluginEngine {
    engine: Engine,
    linker: Linker<State>,
    pooling: bool,
    max_memory_bytes: usize,
    slots: Arc<Semaphore>,
    ticker: EpochTicker,
}

impl fmt::Debug for PluginEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginEngine")
            .field("pooling", &self.pooling)
            .field("max_memory_bytes", &self.max_memory_bytes)
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl PluginEngine {
    pub fn new(config: &EngineConfig) -> Result<Arc<Self>, EngineError> {
        let (engine, pooling) = if config.pooling {
            match Engine::new(&wasmtime_config(Some(config))) {
                Ok(engine) => (engine, true),
                Err(e) => {
                    tracing::warn!(error = %e, "pooling allocator unavailable, using on-demand allocation");
                    (on_demand_engine()?, false)
                }
            }
        } else {
            (on_demand_engine()?, false)
        };
        let linker = linker(&engine).map_err(|e| EngineError::Link(e.into()))?;
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick)?;
        let slots = usize::try_from(config.max_instances).unwrap_or(usize::MAX);
        Ok(Arc::new(PluginEngine {
            engine,
            linker,
            pooling,
            max_memory_bytes: config.max_memory_bytes,
            slots: Arc::new(Semaphore::new(slots)),
            ticker,
        }))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn linker(&self) -> &Linker<State> {
        &self.linker
    }

    /// Whether the pooling allocator is in use.
    pub fn is_pooling(&self) -> bool {
        self.pooling
    }

    /// A call's memory cap, bounded by what the engine was sized for.
    pub(crate) fn memory_cap(&self, requested: usize) -> usize {
        requested.min(self.max_memory_bytes)
    }

    /// Waits for an instance slot; the epoch ticks while it is held.
    pub(crate) async fn slot(&self) -> Option<Slot> {
        let permit = self.slots.clone().acquire_owned().await.ok()?;
        Some(Slot {
            _permit: permit,
            _ticking: self.ticker.activity.enter(),
        })
    }
}

/// The engine without the pooling allocator: the same compatibility hash as the pooling one
/// (`precompile::tests::what_serve_writes_deserializes_into_the_operators_pooling_engine`), so
/// a `vmop precompile` child needs no pool.
pub(crate) fn on_demand_engine() -> Result<Engine, EngineError> {
    Engine::new(&wasmtime_config(None)).map_err(|e| EngineError::Create(e.into()))
}

const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 16;
const MAX_MEMORIES_PER_COMPONENT: u32 = 4;
const MAX_TABLES_PER_COMPONENT: u32 = 16;

/// What the pool holds in total for `n` instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolTotals {
    core_instances: u32,
    memories: u32,
    tables: u32,
}

impl PoolTotals {
    /// `n` × each per-component maximum: `n` instances of the largest accepted component fit.
    fn for_instances(n: u32) -> Self {
        PoolTotals {
            core_instances: n.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT),
            memories: n.saturating_mul(MAX_MEMORIES_PER_COMPONENT),
            tables: n.saturating_mul(MAX_TABLES_PER_COMPONENT),
        }
    }
}

/// Covers a Rust guest's stack (the first MiB of its memory), data and a small heap.
const KEEP_RESIDENT_BYTES: usize = 2 << 20;
const KEEP_RESIDENT_TABLE_BYTES: usize = 64 << 10;

fn wasmtime_config(pooling: Option<&EngineConfig>) -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.wasm_component_model(true);
    if let Some(c) = pooling {
        let n = c.max_instances.max(1);
        let mut pool = PoolingAllocationConfig::new();
        // A Rust wasip2 component is a few core instances (the program plus shims), one memory
        // and a few tables; the per-component maxima leave room for bigger toolchains, and the
        // totals are n times those maxima so that n instances of any accepted component fit.
        let totals = PoolTotals::for_instances(n);
        pool.total_component_instances(n)
            .total_core_instances(totals.core_instances)
            .total_memories(totals.memories)
            .total_tables(totals.tables)
            .total_stacks(n)
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
            .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
            .max_memory_size(c.max_memory_bytes);
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            // Reset only the pages a call dirtied, by copying, and keep them resident: the next
            // call in the slot takes no page faults. Without the ioctl, keeping memory resident
            // would mean a memset of the whole region per call, so it stays off.
            pool.pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
                .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// WASI p2 (nothing granted: see `State`), wasi-http behind the egress hooks, and `log`.
fn linker(engine: &Engine) -> wasmtime::Result<Linker<State>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    bindings::add_to_linker(&mut linker)?;
    Ok(linker)
}

/// An instance slot, held for the duration of one call.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    _ticking: Ticking,
}

/// What the ticker thread waits on: how many calls run, and whether to stop.
#[derive(Debug, Default)]
struct Activity {
    state: Mutex<ActivityState>,
    changed: Condvar,
}

#[derive(Debug, Default, Clone, Copy)]
struct ActivityState {
    running: usize,
    stop: bool,
    /// How many times the thread went to sleep for want of a call (for the tests).
    idle_sleeps: u64,
}

impl ActivityState {
    /// Whether going from `self` to `after` needs the ticker awake: the first call starting
    /// (it sleeps while none runs) or the stop. A call ending never does: the ticker sees that
    /// none runs at its next tick and goes to sleep then, one tick late at most.
    fn wakes_ticker(&self, after: &ActivityState) -> bool {
        (self.running == 0 && after.running > 0) || (!self.stop && after.stop)
    }
}

impl Activity {
    fn enter(self: &Arc<Self>) -> Ticking {
        self.update(|s| s.running += 1);
        Ticking(self.clone())
    }

    /// Applies `f`, and wakes the ticker only when it has something to do about it
    /// ([`ActivityState::wakes_ticker`]): with calls running back to back, waking it on every
    /// call's start and end cost two futex wake-ups and context switches per call.
    fn update(&self, f: impl FnOnce(&mut ActivityState)) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let before = *state;
        f(&mut state);
        let wake = before.wakes_ticker(&state);
        drop(state);
        if wake {
            self.changed.notify_all();
        }
    }

    /// Waits until a call runs (`true`) or the ticker is to stop (`false`); then, while calls
    /// run, sleeps one tick at a time.
    fn next_tick(&self, tick: Duration) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.running == 0 {
            state.idle_sleeps += 1;
        }
        let state = self
            .changed
            .wait_while(state, |s| s.running == 0 && !s.stop)
            .unwrap_or_else(PoisonError::into_inner);
        if state.stop {
            return false;
        }
        let (state, _) = self
            .changed
            .wait_timeout_while(state, tick, |s| !s.stop)
            .unwrap_or_else(PoisonError::into_inner);
        !state.stop
    }
}

/// A running call, as the ticker counts it.
struct Ticking(Arc<Activity>);

impl Drop for Ticking {
    fn drop(&mut self) {
        self.0.update(|s| s.running = s.running.saturating_sub(1));
    }
}

/// Increments the engine's epoch on its own thread, while calls run, until dropped.
struct EpochTicker {
    activity: Arc<Activity>,
    thread: Option<thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: Duration) -> Result<Self, EngineError> {
        Self::start_with(tick, move || engine.increment_epoch())
    }

    fn start_with(
        tick: Duration,
        increment: impl Fn() + Send + 'static,
    ) -> Result<Self, EngineError> {
        let activity = Arc::new(Activity::default());
        let waits = activity.clone();
        let thread = thread::Builder::new()
            .name("vmop-epoch".into())
            .spawn(move || {
                while waits.next_tick(tick) {
                    increment();
                }
            })
            .map_err(EngineError::Ticker)?;
        Ok(EpochTicker {
            activity,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.activity.update(|s| s.stop = true);
        if let Some(thread) = self.thread.take() {
            // The thread only sleeps and increments; it cannot panic in a way worth reporting.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Ticks counted while no call runs, while one does, and after it ended.
    #[test]
    fn the_ticker_sleeps_while_no_call_runs() {
        let ticks = Arc::new(AtomicU64::new(0));
        let counted = ticks.clone();
        let ticker = EpochTicker::start_with(Duration::from_millis(1), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let idle_sleeps = |ticker: &EpochTicker| {
            ticker
                .activity
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .idle_sleeps
        };
        let wait_asleep = |ticker: &EpochTicker, times: u64| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while idle_sleeps(ticker) < times {
                assert!(std::time::Instant::now() < deadline, "never went to sleep");
                thread::yield_now();
            }
        };
        wait_asleep(&ticker, 1);
        // Asleep on the condition variable: a window of 30 ticks' length sees none.
        thread::sleep(Duration::from_millis(30));
        assert_eq!(ticks.load(Ordering::SeqCst), 0, "ticked while idle");

        let call = ticker.activity.enter();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ticks.load(Ordering::SeqCst) < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "never ticked during a call"
            );
            thread::yield_now();
        }
        drop(call);
        wait_asleep(&ticker, 2);
        let after = ticks.load(Ordering::SeqCst);
        thread::sleep(Duration::from_millis(30));
        assert_eq!(
            ticks.load(Ordering::SeqCst),
            after,
            "kept ticking after the call"
        );
        drop(ticker);
    }

    /// Only the first call starting and the stop wake the ticker.
    #[test]
    fn only_the_first_call_and_the_stop_wake_the_ticker() {
        let at = |running, stop| ActivityState {
            running,
            stop,
            idle_sleeps: 0,
        };
        assert!(at(0, false).wakes_ticker(&at(1, false)), "first call");
        assert!(!at(1, false).wakes_ticker(&at(2, false)), "second call");
        assert!(!at(2, false).wakes_ticker(&at(1, false)), "a call ends");
        assert!(
            !at(1, false).wakes_ticker(&at(0, false)),
            "the last call ends"
        );
        assert!(at(3, false).wakes_ticker(&at(3, true)), "stop");
    }

    #[test]
    fn the_pool_fits_max_instances_of_the_largest_component() {
        // Checked on the numbers wasmtime is given (the pool cannot be read back): 64 calls of
        // a 14-core-instance Python component need 896 core instances, QuickJS's 2 memories
        // 128 memories.
        assert_eq!(
            PoolTotals::for_instances(64),
            PoolTotals {
                core_instances: 1024,
                memories: 256,
                tables: 1024,
            }
        );
    }

    #[test]
    fn memory_budget_counts_every_instance_and_the_headroom() {
        let config = EngineConfig {
            max_instances: 16,
            max_memory_bytes: 128 << 20,
            ..EngineConfig::default()
        };
        assert_eq!(config.memory_budget(), (16 * (128 + 16) + 512) << 20);
    }
}
