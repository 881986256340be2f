//! Loading plugins from a plugin directory with real components: pins, corrupt files, WIT
//! compatibility, path escapes, digest reuse, hot replacement with calls in flight, and the
//! precompiled-artifact cache's trust rule.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest, Sha256};
use vmop::plugin::{
    CallContext, CallLimits, EgressPolicy, EngineConfig, LoadError, PluginEngine, PluginRegistry,
    ProviderSettings, RegistryConfig, RegistryStats,
};

fn wasm(name: &str) -> anyhow::Result<Vec<u8>> {
    Ok(std::fs::read(vmop_tests::wasm::path(name)?)?)
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes through a temporary file and a rename, as a volume update does.
fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn registry(plugin_dir: &Path, cache_dir: Option<&Path>) -> anyhow::Result<PluginRegistry> {
    let engine = PluginEngine::new(&EngineConfig {
        max_instances: 8,
        ..EngineConfig::default()
    })?;
    Ok(PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: plugin_dir.to_path_buf(),
            cache_dir: cache_dir.map(Path::to_path_buf),
            info_limits: CallLimits::default(),
        },
    )?)
}

fn plugin_dir(files: &[(&str, &str)]) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for (file, guest) in files {
        std::fs::write(dir.path().join(file), wasm(guest)?)?;
    }
    Ok(dir)
}

#[tokio::test]
async fn a_wrong_pin_is_refused_with_a_clear_error() -> anyhow::Result<()> {
    let dir = plugin_dir(&[("p.wasm", "trivial")])?;
    let actual = sha256(&wasm("trivial")?);
    let reg = registry(dir.path(), None)?;

    let wrong = "0".repeat(64);
    let err = reg
        .load("p.wasm", Some(&wrong))
        .await
        .err()
        .context("wrong pin accepted")?;
    assert!(
        matches!(&err, LoadError::DigestMismatch { expected, actual: a } if *expected == wrong && *a == actual),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&wrong) && message.contains(&actual),
        "{message}"
    );
    assert_eq!(reg.stats().compiled, 0, "a refused file was compiled");

    let err = reg.load("p.wasm", Some("not-a-digest")).await.err();
    assert!(matches!(err, Some(LoadError::InvalidPin { .. })), "{err:?}");

    let plugin = reg
        .load("p.wasm", Some(&format!("sha256:{}", actual.to_uppercase())))
        .await?;
    assert_eq!(plugin.digest(), actual);

    // A pin that stops matching the loaded file stops it being served.
    let err = reg.load("p.wasm", Some(&wrong)).await.err();
    assert!(
        matches!(err, Some(LoadError::DigestMismatch { .. })),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_corrupt_file_is_refused() -> anyhow::Result<()> {
    let trivial = wasm("trivial")?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("garbage.wasm"), b"this is not webassembly")?;
    std::fs::write(
        dir.path().join("truncated.wasm"),
        trivial.get(..trivial.len() / 2).unwrap_or_default(),
    )?;
    // A core module, not a component.
    std::fs::write(dir.path().join("module.wasm"), b"\0asm\x01\0\0\0")?;
    let reg = registry(dir.path(), None)?;
    for file in ["garbage.wasm", "truncated.wasm", "module.wasm"] {
        let err = reg.load(file, None).await.err();
        assert!(
            matches!(err, Some(LoadError::Compile { .. })),
            "{file}: {err:?}"
        );
        assert!(reg.get(file).is_none());
    }
    Ok(())
}

#[tokio::test]
async fn an_incompatible_wit_version_is_refused() -> anyhow::Result<()> {
    let dir = plugin_dir(&[("old.wasm", "wrong_wit")])?;
    let reg = registry(dir.path(), None)?;
    let err = reg.load("old.wasm", None).await.err();
    assert!(
        matches!(&err, Some(LoadError::IncompatibleWit { plugin, host, .. }) if plugin == "0.9.0" && *host == vmop::plugin::WIT_VERSION),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn paths_outside_the_plugin_directory_are_refused() -> anyhow::Result<()> {
    let outside = plugin_dir(&[("evil.wasm", "trivial")])?;
    let dir = tempfile::tempdir()?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins)?;
    std::os::unix::fs::symlink(outside.path().join("evil.wasm"), plugins.join("link.wasm"))?;
    let reg = registry(&plugins, None)?;
    let escape = outside.path().join("evil.wasm");
    for path in [
        PathBuf::from("../evil.wasm"),
        escape,
        PathBuf::from("link.wasm"),
    ] {
        let err = reg.load(&path, None).await.err();
        assert!(
            matches!(err, Some(LoadError::InvalidPath { .. })),
            "{}: {err:?}",
            path.display()
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_second_load_of_the_same_digest_hits_the_cache() -> anyhow::Result<()> {
    let dir = plugin_dir(&[("a.wasm", "trivial"), ("b.wasm", "trivial")])?;
    let reg = registry(dir.path(), None)?;
    let a = reg.load("a.wasm", None).await?;
    let again = reg.load("a.wasm", None).await?;
    let b = reg.load("b.wasm", None).await?;
    assert!(Arc::ptr_eq(&a, &again) && Arc::ptr_eq(&a, &b));
    assert_eq!(
        reg.stats(),
        RegistryStats {
            compiled: 1,
            disk_hits: 0,
            digest_hits: 1,
            repeated_failures: 0
        }
    );
    Ok(())
}

#[tokio::test]
async fn a_changed_file_is_noticed_on_load() -> anyhow::Result<()> {
    let dir = plugin_dir(&[("p.wasm", "trivial")])?;
    let reg = registry(dir.path(), None)?;
    assert_eq!(reg.load("p.wasm", None).await?.info().version, "0.1.0");
    replace(&dir.path().join("p.wasm"), &wasm("trivial_v2")?)?;
    assert_eq!(reg.load("p.wasm", None).await?.info().version, "0.2.0");
    // Back to the first version: it was dropped when nothing served it any more, so it is
    // compiled again (with a disk cache, as `vmop run` has, it is mapped back instead).
    replace(&dir.path().join("p.wasm"), &wasm("trivial")?)?;
    assert_eq!(reg.load("p.wasm", None).await?.info().version, "0.1.0");
    assert_eq!(
        reg.stats(),
        RegistryStats {
            compiled: 3,
            disk_hits: 0,
            digest_hits: 0,
            repeated_failures: 0
        }
    );
    assert_eq!(reg.plugins_held(), 1);
    Ok(())
}

#[tokio::test]
async fn replacing_the_file_switches_versions_without_failing_calls_in_flight() -> anyhow::Result<()>
{
    let dir = plugin_dir(&[("provider.wasm", "hostile")])?;
    let reg = registry(dir.path(), None)?;
    let mut events = reg.subscribe();
    let v1 = reg.load("provider.wasm", None).await?;
    assert_eq!(v1.info().version, "0.1.0");

    // A call that is provably in flight: its request reached the server, which holds the answer.
    let vmop_tests::gated::Gated {
        port,
        accepted,
        release,
    } = vmop_tests::gated::serve().await?;
    let authority = format!("127.0.0.1:{port}");
    let ctx = CallContext {
        settings: ProviderSettings {
            settings: BTreeMap::from([
                ("mode".to_string(), "http".to_string()),
                ("authority".to_string(), authority.clone()),
            ]),
            secrets: BTreeMap::new(),
            cluster: "vmop-tests".to_owned(),
        },
        egress: EgressPolicy::parse([format!("http://{authority}")])?,
        limits: CallLimits {
            timeout: Duration::from_secs(60),
            ..CallLimits::default()
        },
        label: "loading-test".to_string(),
    };
    let in_flight = tokio::spawn({
        let v1 = v1.clone();
        async move { v1.get(&ctx, "vm-1").await }
    });
    accepted
        .await
        .context("the in-flight call never reached the server")?;

    replace(&dir.path().join("provider.wasm"), &wasm("hostile_v2")?)?;
    let changed = reg.poll_changes().await;
    let v2_digest = sha256(&wasm("hostile_v2")?);
    let event = events.recv().await?;
    assert_eq!(changed, vec![event.clone()]);
    assert_eq!(event.path, PathBuf::from("provider.wasm"));
    assert_eq!(event.digest.as_deref(), Some(v2_digest.as_str()));
    let v2 = reg
        .get("provider.wasm")
        .context("nothing served after the swap")?;
    assert_eq!(v2.info().version, "0.2.0");
    assert_eq!(v2.digest(), v2_digest);

    // The old version finishes its call.
    let _ = release.send(());
    let status = in_flight
        .await??
        .context("the in-flight call found no VM")?;
    assert_eq!(status.message.as_deref(), Some("status 200, 2 bytes"));
    assert_eq!(
        reg.plugins_held(),
        1,
        "the old version is dropped once nothing serves it"
    );

    // A file that changes into garbage stops being served, and says so.
    replace(&dir.path().join("provider.wasm"), b"garbage")?;
    let failed = reg.poll_changes().await;
    assert!(
        matches!(failed.as_slice(), [e] if e.digest.is_none() && e.error.is_some()),
        "{failed:?}"
    );
    assert!(reg.get("provider.wasm").is_none());
    assert_eq!(reg.plugins_held(), 0, "nothing is served, nothing is kept");
    Ok(())
}

#[tokio::test]
async fn the_watcher_swaps_a_replaced_file() -> anyhow::Result<()> {
    let dir = plugin_dir(&[("p.wasm", "trivial")])?;
    let reg = registry(dir.path(), None)?;
    let mut events = reg.subscribe();
    reg.load("p.wasm", None).await?;
    let watcher = reg.watch(Duration::from_millis(20));
    replace(&dir.path().join("p.wasm"), &wasm("trivial_v2")?)?;
    let event = tokio::time::timeout(Duration::from_secs(60), events.recv())
        .await
        .context("no change event")??;
    assert_eq!(event.path, PathBuf::from("p.wasm"));
    assert_eq!(
        reg.get("p.wasm")
            .map(|p| p.info().version.clone())
            .as_deref(),
        Some("0.2.0")
    );
    drop(reg);
    tokio::time::timeout(Duration::from_secs(60), watcher)
        .await
        .context("the watcher outlived its registry")??;
    Ok(())
}

#[tokio::test]
async fn precompiled_artifacts_are_reused_only_when_this_operator_wrote_them() -> anyhow::Result<()>
{
    let plugins = plugin_dir(&[("p.wasm", "trivial")])?;
    let cache = tempfile::tempdir()?;

    // First registry: compiles and writes the artifact.
    let first = registry(plugins.path(), Some(cache.path()))?;
    let digest = first.load("p.wasm", None).await?.digest().to_string();
    assert_eq!(
        first.stats(),
        RegistryStats {
            compiled: 1,
            disk_hits: 0,
            digest_hits: 0,
            repeated_failures: 0
        }
    );
    let artifacts: Vec<PathBuf> = std::fs::read_dir(cache.path())?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    let [artifact] = artifacts.as_slice() else {
        anyhow::bail!("expected one artifact, found {artifacts:?}");
    };
    assert!(artifact.to_string_lossy().contains(&digest));

    // A restarted registry (new engine, same cache dir) deserializes it.
    let second = registry(plugins.path(), Some(cache.path()))?;
    second.load("p.wasm", None).await?;
    assert_eq!(
        second.stats(),
        RegistryStats {
            compiled: 0,
            disk_hits: 1,
            digest_hits: 0,
            repeated_failures: 0
        }
    );

    // The same bytes planted in another cache directory (another key) are not trusted.
    let foreign = tempfile::tempdir()?;
    let planted = foreign
        .path()
        .join(artifact.file_name().context("artifact has no name")?);
    std::fs::copy(artifact, &planted)?;
    let third = registry(plugins.path(), Some(foreign.path()))?;
    third.load("p.wasm", None).await?;
    assert_eq!(
        third.stats(),
        RegistryStats {
            compiled: 1,
            disk_hits: 0,
            digest_hits: 0,
            repeated_failures: 0
        }
    );

    // An artifact changed after it was written is not trusted either (and is rewritten).
    let mut bytes = std::fs::read(artifact)?;
    if let Some(b) = bytes.last_mut() {
        *b ^= 0xff;
    }
    replace(artifact, &bytes)?;
    let fourth = registry(plugins.path(), Some(cache.path()))?;
    fourth.load("p.wasm", None).await?;
    assert_eq!(
        fourth.stats(),
        RegistryStats {
            compiled: 1,
            disk_hits: 0,
            digest_hits: 0,
            repeated_failures: 0
        }
    );
    let fifth = registry(plugins.path(), Some(cache.path()))?;
    fifth.load("p.wasm", None).await?;
    assert_eq!(
        fifth.stats(),
        RegistryStats {
            compiled: 0,
            disk_hits: 1,
            digest_hits: 0,
            repeated_failures: 0
        }
    );
    Ok(())
}
