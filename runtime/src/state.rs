//! The data of one call's Store: WASI with nothing granted, wasi-http behind the egress hooks,
//! the memory limiter, captured output and the bounded `log` import.
//!
//! # Guarantees
//!
//! - The memory cap is on the whole instance: the sum of every linear memory of the Store, not
//!   each memory alone, so a component with several memories gets one cap
//!   (`state::tests::the_cap_is_on_the_sum_of_all_memories`, on a real two-memory module). The
//!   same holds for table elements ([`MAX_TABLE_ELEMENTS`] across all tables).
//! - `log` lines and captured stdout/stderr are redacted with the policy's
//!   [`Redactor`](super::redact::Redactor) before they are written anywhere
//!   (`state::tests::log_lines_are_redacted_before_the_cut`).

use std::time::Instant;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::egress::EgressHooks;
use vmop_contract::text::cut;

use super::output::CapturedOutput;
use super::redact::Redactor;

/// Per-call bounds on what a guest may say through `log`.
const MAX_LOG_LINES: u32 = 256;
const MAX_LOG_LINE_BYTES: usize = 4096;
/// Per-stream bound on captured stdout/stderr.
pub(crate) const MAX_CAPTURED_OUTPUT: usize = 16 * 1024;
/// Tables, instances and memories one component may create; a Rust guest needs a handful.
const MAX_INSTANCES: usize = 32;
const MAX_TABLES: usize = 32;
const MAX_MEMORIES: usize = 8;
/// Table elements across all tables of one instance.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Host-side resources (streams, HTTP fields and requests, pollables) one call may hold at
/// once. They live outside the guest's memory cap, so they get their own bound; a provider
/// needs a few dozen.
const MAX_RESOURCES: usize = 4096;

pub(crate) struct State {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: EgressHooks,
    pub limiter: MemoryLimiter,
    pub log: LogSink,
    /// When the epoch callback turns the next tick into a deadline trap.
    pub deadline: Instant,
}

impl State {
    pub fn new(
        hooks: EgressHooks,
        memory_bytes: usize,
        deadline: Instant,
        stdout: CapturedOutput,
        stderr: CapturedOutput,
    ) -> Self {
        // No preopens, environment or arguments are ever added; sockets are switched off
        // explicitly although 48 denies them by default.
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let label = hooks.label.clone();
        let redactor = hooks.policy.redactor().clone();
        stdout.set_redactor(redactor.clone());
        stderr.set_redactor(redactor.clone());
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        State {
            wasi,
            http: WasiHttpCtx::new(),
            table,
            hooks,
            limiter: MemoryLimiter::new(memory_bytes),
            log: LogSink::new(label, redactor),
            deadline,
        }
    }

    pub fn label(&self) -> &str {
        &self.log.label
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// The `log` import: lines go to `tracing` tagged with the ProviderConfig's name, at most
/// [`MAX_LOG_LINES`] per call, each cut at [`MAX_LOG_LINE_BYTES`].
#[derive(Debug)]
pub(crate) struct LogSink {
    label: String,
    redactor: Redactor,
    lines: u32,
    pub dropped: u64,
}

impl LogSink {
    fn new(label: String, redactor: Redactor) -> Self {
        LogSink {
            label,
            redactor,
            lines: 0,
            dropped: 0,
        }
    }

    /// One `log` line of the plugin's (each contract version's `log` import ends here).
    pub(crate) fn write(&mut self, level: tracing::Level, message: &str) {
        if self.lines >= MAX_LOG_LINES {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        self.lines += 1;
        let message = self.line(message);
        let provider = self.label.as_str();
        if level == tracing::Level::ERROR {
            tracing::error!(provider, "{message}");
        } else if level == tracing::Level::WARN {
            tracing::warn!(provider, "{message}");
        } else if level == tracing::Level::INFO {
            tracing::info!(provider, "{message}");
        } else if level == tracing::Level::DEBUG {
            tracing::debug!(provider, "{message}");
        } else {
            tracing::trace!(provider, "{message}");
        }
    }
}

impl LogSink {
    /// `message` redacted, then cut at [`MAX_LOG_LINE_BYTES`]. Only the head that can survive
    /// the cut (plus the longest Secret value, so one straddling the cut is found) is scanned.
    fn line(&self, message: &str) -> String {
        let head = cut(
            message,
            MAX_LOG_LINE_BYTES.saturating_add(self.redactor.max_len()),
        );
        cut(&self.redactor.text(head), MAX_LOG_LINE_BYTES).to_owned()
    }
}

/// Caps the sum of all linear memories (and of all table elements) of one instance at the
/// call's limit, and remembers that it did, so the sandbox can report the cap rather than
/// whatever the guest did after a failed allocation.
///
/// wasmtime calls the limiter for every memory's initial size (`current` 0) and for every
/// growth, and only for memories and tables of this Store, so the running sum of
/// `desired - current` is the instance's total.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    cap: usize,
    memory_bytes: usize,
    table_elements: usize,
    pub hit: bool,
}

/// The error a memory growth past the cap raises (trap on grow failure).
#[derive(Debug, thiserror::Error)]
#[error(
    "the instance's linear memories would grow to {desired} bytes in total, over the cap of {cap}"
)]
pub(crate) struct MemoryCapExceeded {
    pub desired: usize,
    pub cap: usize,
}

impl MemoryLimiter {
    pub(crate) fn new(cap: usize) -> Self {
        MemoryLimiter {
            cap,
            memory_bytes: 0,
            table_elements: 0,
            hit: false,
        }
    }

    /// Bytes of linear memory the instance holds.
    #[cfg(test)]
    fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .memory_bytes
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.cap {
            self.hit = true;
            return Err(wasmtime::Error::new(MemoryCapExceeded {
                desired: total,
                cap: self.cap,
            }));
        }
        self.memory_bytes = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .table_elements
            .saturating_sub(current)
            .saturating_add(desired);
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Engine, Instance, Module, Store};

    /// `(module (memory (export "a") 1) (memory (export "b") 1))`, hand-assembled (the host
    /// builds wasmtime without the text parser).
    const TWO_MEMORIES: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x05, 0x05, 0x02, 0x00, 0x01, 0x00, 0x01, // memories: 2 × {min 1 page}
        0x07, 0x09, 0x02, 0x01, b'a', 0x02, 0x00, 0x01, b'b', 0x02, 0x01, // exports a, b
    ];
    const PAGE: usize = 64 << 10;

    #[test]
    fn the_cap_is_on_the_sum_of_all_memories() -> wasmtime::Result<()> {
        let engine = Engine::default();
        let module = Module::new(&engine, TWO_MEMORIES)?;
        let mut store = Store::new(&engine, MemoryLimiter::new(3 * PAGE));
        store.limiter(|l| l);
        let instance = Instance::new(&mut store, &module, &[])?;
        assert_eq!(store.data().memory_bytes(), 2 * PAGE);
        let (Some(a), Some(b)) = (
            instance.get_memory(&mut store, "a"),
            instance.get_memory(&mut store, "b"),
        ) else {
            panic!("the module exports two memories");
        };
        a.grow(&mut store, 1)?;
        assert_eq!(store.data().memory_bytes(), 3 * PAGE);
        // Each memory alone (2 pages) is under the cap; the instance (4 pages) is not.
        assert!(b.grow(&mut store, 1).is_err());
        assert!(store.data().hit);
        assert_eq!(store.data().memory_bytes(), 3 * PAGE);
        Ok(())
    }

    #[test]
    fn log_lines_are_redacted_before_the_cut() {
        let sink = LogSink::new("p".into(), Redactor::new(["SECRET-VALUE"]));
        assert_eq!(sink.line("key SECRET-VALUE!"), "key [redacted]!");
        let straddling = format!("{}SECRET-VALUE", "x".repeat(MAX_LOG_LINE_BYTES - 4));
        let line = sink.line(&straddling);
        assert!(!line.contains("SECR"), "{line}");
        assert_eq!(line.len(), MAX_LOG_LINE_BYTES);
    }
}
