//! The data of one call's Store: WASI with nothing granted, wasi-http behind the egress hooks,
//! the memory limiter, captured output and the bounded `log` import.

use std::time::Instant;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{self, wit_log};
use super::egress::EgressHooks;
use super::output::CapturedOutput;

/// Per-call bounds on what a guest may say through `log`.
const MAX_LOG_LINES: u32 = 256;
const MAX_LOG_LINE_BYTES: usize = 4096;
/// Per-stream bound on captured stdout/stderr.
pub(crate) const MAX_CAPTURED_OUTPUT: usize = 16 * 1024;
/// Tables, instances and memories one component may create; a Rust guest needs a handful.
const MAX_INSTANCES: usize = 32;
const MAX_TABLES: usize = 32;
const MAX_MEMORIES: usize = 8;
const MAX_TABLE_ELEMENTS: usize = 100_000;
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
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        State {
            wasi,
            http: WasiHttpCtx::new(),
            table,
            hooks,
            limiter: MemoryLimiter::new(memory_bytes),
            log: LogSink::new(label),
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

impl bindings::vmop::provider::types::Host for State {}

impl wit_log::Host for State {
    fn log(&mut self, level: wit_log::Level, message: String) {
        self.log.write(level, &message);
    }
}

/// The `log` import: lines go to `tracing` tagged with the ProviderConfig's name, at most
/// [`MAX_LOG_LINES`] per call, each cut at [`MAX_LOG_LINE_BYTES`].
#[derive(Debug)]
pub(crate) struct LogSink {
    label: String,
    lines: u32,
    pub dropped: u64,
}

impl LogSink {
    fn new(label: String) -> Self {
        LogSink {
            label,
            lines: 0,
            dropped: 0,
        }
    }

    fn write(&mut self, level: wit_log::Level, message: &str) {
        if self.lines >= MAX_LOG_LINES {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        self.lines += 1;
        let message = truncate(message, MAX_LOG_LINE_BYTES);
        let provider = self.label.as_str();
        match level {
            wit_log::Level::Trace => tracing::trace!(provider, "{message}"),
            wit_log::Level::Debug => tracing::debug!(provider, "{message}"),
            wit_log::Level::Info => tracing::info!(provider, "{message}"),
            wit_log::Level::Warn => tracing::warn!(provider, "{message}"),
            wit_log::Level::Error => tracing::error!(provider, "{message}"),
        }
    }
}

/// Cuts at a char boundary at or below `max` bytes.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

/// Caps each linear memory at the call's limit and remembers that it did, so the sandbox can
/// report the cap rather than whatever the guest did after a failed allocation.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    cap: usize,
    pub hit: bool,
}

/// The error a memory growth past the cap raises (trap on grow failure).
#[derive(Debug, thiserror::Error)]
#[error("linear memory would grow to {desired} bytes, over the cap of {cap}")]
pub(crate) struct MemoryCapExceeded {
    pub desired: usize,
    pub cap: usize,
}

impl MemoryLimiter {
    fn new(cap: usize) -> Self {
        MemoryLimiter { cap, hit: false }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.hit = true;
            return Err(wasmtime::Error::new(MemoryCapExceeded {
                desired,
                cap: self.cap,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
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
    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(super::truncate("héllo", 2), "h");
        assert_eq!(super::truncate("héllo", 3), "hé");
        assert_eq!(super::truncate("abc", 10), "abc");
    }
}
