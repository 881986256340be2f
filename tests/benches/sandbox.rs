//! `cargo bench -p vmop-tests --bench sandbox`: the cost of the sandbox, measured in one run.
//!
//! - one call through the sandbox (fresh Store + instantiate + `create` of the trivial plugin +
//!   drop), with the pooling allocator when available and with on-demand allocation, against a
//!   native Rust `async fn` with the same logic;
//! - loading a precompiled artifact from the cache against compiling the component;
//! - per real provider (`sandbox/providers.rs`: ec2 and testcloud, each in Rust and in Python):
//!   size, first compile, cached load, a call without I/O, a `get` against its loopback
//!   backend (moto, the testcloud) and the conformance kit's result there.
//!
//! Medians of many iterations after a warm-up; the numbers are printed, not judged. The
//! provider table needs moto and the Python provider (`eval "$(scripts/prepare.sh)"` before
//! the build); `VMOP_BENCH_PROVIDERS=0` skips it.

#![allow(clippy::print_stdout)] // A benchmark's output is its report.

#[path = "sandbox/providers.rs"]
mod providers;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use vmop::plugin::cache::ArtifactCache;
use vmop::plugin::{
    CallContext, CallLimits, EngineConfig, Phase, PluginEngine, PluginRegistry, ProviderError,
    ProviderSettings, RegistryConfig, VmSpec, VmStatus,
};
use vmop_tests::fixtures::vm_spec;
use wasmtime::component::Component;

const SANDBOX_CALLS: usize = 10_000;
const NATIVE_BATCHES: usize = 1_000;
const NATIVE_BATCH: usize = 1_000;
const COMPILES: usize = 20;
const CACHED_LOADS: usize = 200;

/// The trivial guest's `create`, natively: same lookup, same formatting, same result.
async fn native_create(
    config: &ProviderSettings,
    spec: &VmSpec,
) -> Result<VmStatus, ProviderError> {
    if let Some(ms) = config.settings.get("sleep-ms") {
        let ms: u64 = ms
            .parse()
            .map_err(|_| ProviderError::InvalidSpec(format!("sleep-ms is not a number: {ms}")))?;
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Ok(VmStatus {
        id: format!("vm-{}", spec.uid),
        phase: Phase::Running,
        addresses: Vec::new(),
        message: Some("0.1.0".to_string()),
        owner: None,
    })
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn spec() -> VmSpec {
    vm_spec("6f1c2d3e-0000-4000-8000-000000000001")
        .image("ami-123")
        .cpu(2)
        .memory_mib(2048)
        .label("app", "web")
        .build()
}

fn context() -> CallContext {
    CallContext {
        settings: ProviderSettings {
            settings: BTreeMap::from([("region".into(), "us-east-1".into())]),
            secrets: BTreeMap::from([("access-key".into(), "AKIA...".into())]),
            cluster: "vmop-tests".to_owned(),
        },
        label: "bench".into(),
        ..CallContext::default()
    }
}

async fn sandboxed_call_median(
    plugin_dir: &Path,
    pooling: bool,
) -> anyhow::Result<(Duration, bool)> {
    let engine = PluginEngine::new(&EngineConfig {
        pooling,
        ..EngineConfig::default()
    })?;
    let pooled = engine.is_pooling();
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: plugin_dir.to_path_buf(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        },
    )?;
    let plugin = registry.load("trivial.wasm", None).await?;
    let (ctx, spec) = (context(), spec());
    for _ in 0..SANDBOX_CALLS / 10 {
        black_box(plugin.create(&ctx, &spec).await?);
    }
    let mut samples = Vec::with_capacity(SANDBOX_CALLS);
    for _ in 0..SANDBOX_CALLS {
        let start = Instant::now();
        let status = plugin.create(black_box(&ctx), black_box(&spec)).await?;
        samples.push(start.elapsed());
        black_box(status);
    }
    Ok((median(samples), pooled))
}

async fn native_call_median() -> anyhow::Result<Duration> {
    let (ctx, spec) = (context(), spec());
    let mut samples = Vec::with_capacity(NATIVE_BATCHES);
    for _ in 0..NATIVE_BATCHES {
        let start = Instant::now();
        for _ in 0..NATIVE_BATCH {
            black_box(native_create(black_box(&ctx.settings), black_box(&spec)).await?);
        }
        samples.push(start.elapsed() / u32::try_from(NATIVE_BATCH)?);
    }
    Ok(median(samples))
}

fn compile_vs_cached(wasm: &[u8], cache_dir: &Path) -> anyhow::Result<(Duration, Duration)> {
    let engine = PluginEngine::new(&EngineConfig::default())?;
    let engine = engine.engine();
    let mut compiles = Vec::with_capacity(COMPILES);
    let mut component = None;
    for _ in 0..COMPILES {
        let start = Instant::now();
        let c =
            Component::new(engine, wasm).map_err(|e| anyhow::anyhow!("compile failed: {e:?}"))?;
        compiles.push(start.elapsed());
        component = Some(c);
    }
    let component = component.context("no compile ran")?;
    let cache = ArtifactCache::new(cache_dir, engine)?;
    let digest = "bench";
    cache.store(digest, &component)?;
    let mut loads = Vec::with_capacity(CACHED_LOADS);
    for _ in 0..CACHED_LOADS {
        let start = Instant::now();
        let loaded = cache
            .load(engine, digest)?
            .context("the artifact was not reused")?;
        loads.push(start.elapsed());
        black_box(loaded);
    }
    Ok((median(compiles), median(loads)))
}

fn main() -> anyhow::Result<()> {
    let wasm_path = vmop_tests::wasm::path("trivial")?;
    let wasm = std::fs::read(wasm_path)?;
    let plugin_dir = tempfile::tempdir()?;
    std::fs::write(plugin_dir.path().join("trivial.wasm"), &wasm)?;
    let cache_dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    let (pooled_call, pooled) = rt.block_on(sandboxed_call_median(plugin_dir.path(), true))?;
    let (on_demand_call, _) = rt.block_on(sandboxed_call_median(plugin_dir.path(), false))?;
    let native = rt.block_on(native_call_median())?;
    let (compile, cached) = compile_vs_cached(&wasm, cache_dir.path())?;

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(f64::MIN_POSITIVE);
    let sandbox = if pooled { pooled_call } else { on_demand_call };
    println!(
        "vmop sandbox benchmark (trivial plugin, {} bytes)",
        wasm.len()
    );
    println!(
        "  sandboxed call, fresh Store + instantiate + create ({}): median {:.2} µs over {SANDBOX_CALLS} calls",
        if pooled {
            "pooling allocator"
        } else {
            "pooling unavailable: on-demand"
        },
        micros(pooled_call)
    );
    println!(
        "  sandboxed call, on-demand allocator:                       median {:.2} µs over {SANDBOX_CALLS} calls",
        micros(on_demand_call)
    );
    println!(
        "  native async fn, same logic:                               median {:.3} µs over {} calls",
        micros(native),
        NATIVE_BATCHES * NATIVE_BATCH
    );
    println!(
        "  sandboxed / native:                                        {:.0}x",
        ratio(sandbox, native)
    );
    println!(
        "  cold compile (Component::new):                             median {:.2} ms over {COMPILES}",
        micros(compile) / 1000.0
    );
    println!(
        "  cached load (verified read + Component::deserialize):      median {:.1} µs over {CACHED_LOADS}",
        micros(cached)
    );
    println!(
        "  compile / cached load:                                     {:.0}x",
        ratio(compile, cached)
    );

    if std::env::var("VMOP_BENCH_PROVIDERS").is_ok_and(|v| v == "0") {
        return Ok(());
    }
    println!(
        "\nproviders (first compile: registry load with an empty cache; cached load: median of new registries over it)"
    );
    println!("{}", providers::Row::HEADER);
    for (guest, provider, language) in providers::PROVIDERS {
        let calls = if language == "Python" { 300 } else { 3000 };
        let row = rt.block_on(providers::measure(guest, provider, language, calls))?;
        println!("{row}");
    }
    Ok(())
}
