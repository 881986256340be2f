//! `vmop_plugin_load_seconds` from a real registry over real components: loads that did work
//! (compile, refusal) are timed with their outcome, loads answered from memory are not, and
//! the watcher's reloads count as well.

use std::path::Path;

use vmop::plugin::{CallLimits, EngineConfig, PluginEngine, PluginRegistry, RegistryConfig};
use vmop::telemetry::metrics::{Format, Metrics};

fn registry(plugin_dir: &Path, metrics: &Metrics) -> anyhow::Result<PluginRegistry> {
    let engine = PluginEngine::new(&EngineConfig {
        max_instances: 4,
        ..EngineConfig::default()
    })?;
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: plugin_dir.to_path_buf(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        },
    )?;
    Ok(registry.with_observer(metrics.load_observer()))
}

/// `vmop_plugin_load_seconds_count{outcome}` (0 while the series does not exist).
fn loads(metrics: &Metrics, outcome: &str) -> anyhow::Result<u64> {
    let text = metrics.encode(Format::Prometheus)?;
    let prefix = format!("vmop_plugin_load_seconds_count{{outcome=\"{outcome}\"}} ");
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(str::parse)
        .transpose()?
        .unwrap_or(0))
}

#[tokio::test]
async fn loads_that_did_work_are_timed_with_their_outcome() -> anyhow::Result<()> {
    let trivial = std::fs::read(vmop_tests::wasm::path("trivial")?)?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("a.wasm"), &trivial)?;
    std::fs::write(dir.path().join("b.wasm"), &trivial)?;
    std::fs::write(dir.path().join("garbage.wasm"), b"not webassembly")?;
    let metrics = Metrics::new();
    let reg = registry(dir.path(), &metrics)?;

    reg.load("a.wasm", None).await?;
    assert_eq!(loads(&metrics, "ok")?, 1, "a compile is timed");
    reg.load("a.wasm", None).await?;
    reg.load("b.wasm", None).await?;
    assert_eq!(
        loads(&metrics, "ok")?,
        1,
        "an unchanged file and a known digest are answered from memory, not timed"
    );

    assert!(reg.load("a.wasm", Some(&"0".repeat(64))).await.is_err());
    assert_eq!(loads(&metrics, "digest_mismatch")?, 1);
    assert!(reg.load("garbage.wasm", None).await.is_err());
    assert_eq!(loads(&metrics, "invalid_plugin")?, 1);

    // The watcher's reload of a file that changed into garbage is a failed load too.
    let tmp = dir.path().join("b.tmp");
    std::fs::write(&tmp, b"still not webassembly")?;
    std::fs::rename(&tmp, dir.path().join("b.wasm"))?;
    let events = reg.poll_changes().await;
    assert!(
        events
            .iter()
            .any(|e| e.path == Path::new("b.wasm") && e.digest.is_none()),
        "{events:?}"
    );
    assert_eq!(loads(&metrics, "invalid_plugin")?, 2);
    assert_eq!(loads(&metrics, "ok")?, 1);
    Ok(())
}
