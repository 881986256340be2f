//! A plugin file over the size bound is refused before it is read: a 100 MiB garbage file
//! costs no 100 MiB of memory. The peak RSS it reads is the process's, so the test runs in a
//! process of its own (`vmop_tests::alone`), where no other test allocates next to it.

use std::path::Path;

use anyhow::{Context as _, ensure};
use vmop::plugin::{
    CallLimits, DEFAULT_MAX_PLUGIN_BYTES, EngineConfig, LoadError, PluginEngine, PluginRegistry,
    RegistryConfig,
};

/// `VmHWM` (peak resident set) of this process, in bytes.
fn peak_rss() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}

#[tokio::test]
async fn oversized_plugin_is_refused_with_bounded_rss() -> anyhow::Result<()> {
    if !vmop_tests::alone::in_own_process(
        module_path!(),
        "oversized_plugin_is_refused_with_bounded_rss",
    )? {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let registry = PluginRegistry::new(
        PluginEngine::new(&EngineConfig {
            max_instances: 2,
            ..EngineConfig::default()
        })?,
        RegistryConfig {
            plugin_dir: dir.path().to_path_buf(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        },
    )?;
    // 100 MiB of garbage (sparse: the disk does not care, a read would).
    let file = std::fs::File::create(dir.path().join("garbage.wasm"))?;
    file.set_len(100 << 20)?;
    // Reset the peak to the current RSS, so the peak below is this load's.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let before = peak_rss()?;
    let result = registry.load(Path::new("garbage.wasm"), None).await;
    let growth = peak_rss()?.saturating_sub(before);
    ensure!(
        matches!(&result, Err(LoadError::TooLarge { limit, .. }) if *limit == DEFAULT_MAX_PLUGIN_BYTES),
        "{result:?}"
    );
    let message = result.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(message.contains("larger than the limit"), "{message}");
    println!(
        "peak RSS growth while refusing a 100 MiB file: {} KiB",
        growth >> 10
    );
    ensure!(growth < 16 << 20, "RSS grew by {} MiB", growth >> 20);

    // The bound is configurable; under it, garbage is read and fails to compile as before.
    let small = registry.with_max_plugin_bytes(1 << 20);
    std::fs::write(dir.path().join("small.wasm"), vec![0xAB; 2 << 20])?;
    let result = small.load(Path::new("small.wasm"), None).await;
    ensure!(
        matches!(result, Err(LoadError::TooLarge { .. })),
        "{result:?}"
    );
    std::fs::write(dir.path().join("small.wasm"), vec![0xAB; 512 << 10])?;
    let result = small.load(Path::new("small.wasm"), None).await;
    ensure!(
        matches!(result, Err(LoadError::Compile { .. })),
        "{result:?}"
    );
    Ok(())
}
