//! The precompiled cache is trusted across restarts: a restarted operator maps the ec2 plugin
//! from its cache directory instead of compiling it, and a flipped byte in the artifact is
//! refused and recompiled. A cold operator compiles in a child process (`plugin::precompile`). Also measures restart-to-Ready of a ProviderConfig, cold compile vs
//! trusted cache, in one run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use vmop::api::ProviderConfig;
use vmop::plugin::{CallLimits, EngineConfig, PluginEngine, PluginRegistry, RegistryConfig};
use vmop_tests::operator::{Env, Operator, wait_for};

use crate::operator_bin;

const COMPILED: &str = "plugin compiled";
const FROM_CACHE: &str = "plugin loaded from the precompiled cache, not compiled";
const REFUSED: &str = "failed authentication";
const IN_CHILD: &str = r#""in_child":true"#;
const CHILD_FALLBACK: &str = "compiling the plugin in this process instead of a child";

fn artifacts(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect())
}

/// Clears the ProviderConfig's conditions, starts an operator, and waits until it has made the
/// ProviderConfig Ready again; returns the operator and the time from start to Ready.
async fn start_until_ready(
    env: &Env,
    name: &str,
    cache: &Path,
) -> anyhow::Result<(Operator, Duration)> {
    env.provider_configs()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "conditions": null } })),
        )
        .await?;
    let started = Instant::now();
    let operator = env
        .operator()
        .arg(format!("--cache-dir={}", cache.display()))
        .start(operator_bin())?;
    wait_for(
        env.provider_configs(),
        name,
        "Ready=True",
        |pc: Option<&ProviderConfig>| {
            pc.and_then(|pc| pc.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
    )
    .await?;
    Ok((operator, started.elapsed()))
}

#[tokio::test]
async fn restarted_operator_loads_from_the_cache_and_refuses_a_flipped_byte() -> anyhow::Result<()>
{
    let env = Env::new("cache-restart").await?;
    let provider = env.standard_provider("aws").await?;
    let cache = tempfile::tempdir()?;

    let (mut cold, cold_time) = start_until_ready(&env, &provider, cache.path()).await?;
    // Compiled by a `vmop precompile` child of the operator, not in the operator's memory.
    let log = cold.log();
    ensure!(log.contains(COMPILED) && log.contains(IN_CHILD), "{log}");
    ensure!(!log.contains(CHILD_FALLBACK), "{log}");
    cold.kill().await?;
    let written = artifacts(cache.path())?;
    ensure!(written.len() == 1, "{written:?}");

    let (mut warm, warm_time) = start_until_ready(&env, &provider, cache.path()).await?;
    let log = warm.log();
    ensure!(log.contains(FROM_CACHE), "{log}");
    ensure!(
        !log.contains(COMPILED),
        "the restarted operator compiled: {log}"
    );
    warm.kill().await?;
    println!(
        "restart-to-Ready of ProviderConfig {provider} (ec2 plugin): cold compile {cold_time:?}, \
         trusted cache {warm_time:?}, ratio cold/cache {:.2}",
        cold_time.as_secs_f64() / warm_time.as_secs_f64()
    );

    // One flipped byte: refused, deleted, compiled again, and a fresh artifact written.
    let path = written.first().context("no artifact")?;
    let mut bytes = std::fs::read(path)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(path, &bytes)?;
    let (mut tampered, _) = start_until_ready(&env, &provider, cache.path()).await?;
    let log = tampered.log();
    ensure!(log.contains(REFUSED) && log.contains(COMPILED), "{log}");
    ensure!(!log.contains(FROM_CACHE), "{log}");
    tampered.kill().await?;
    ensure!(
        std::fs::read(path)? != bytes,
        "the tampered artifact was kept"
    );
    Ok(())
}

/// The same in-process, where nothing but loading is timed: a new registry (as after a restart)
/// over the same cache directory maps the artifact without compiling.
#[tokio::test]
async fn a_new_registry_maps_the_artifact_without_compiling() -> anyhow::Result<()> {
    let plugins = tempfile::tempdir()?;
    std::fs::copy(
        vmop_tests::wasm::path("vmop_provider_ec2")?,
        plugins.path().join("ec2.wasm"),
    )?;
    let cache = tempfile::tempdir()?;
    let registry = || -> anyhow::Result<PluginRegistry> {
        Ok(PluginRegistry::new(
            PluginEngine::new(&EngineConfig {
                max_instances: 2,
                ..EngineConfig::default()
            })?,
            RegistryConfig {
                plugin_dir: plugins.path().to_path_buf(),
                cache_dir: Some(cache.path().to_path_buf()),
                info_limits: CallLimits::default(),
            },
        )?)
    };
    let first = registry()?;
    let started = Instant::now();
    first.load("ec2.wasm", None).await?;
    let cold = started.elapsed();
    let second = registry()?;
    let started = Instant::now();
    second.load("ec2.wasm", None).await?;
    let warm = started.elapsed();
    assert_eq!((first.stats().compiled, first.stats().disk_hits), (1, 0));
    assert_eq!((second.stats().compiled, second.stats().disk_hits), (0, 1));
    println!(
        "ec2 plugin load: compile {cold:?}, trusted cache {warm:?}, ratio {:.1}",
        cold.as_secs_f64() / warm.as_secs_f64()
    );
    Ok(())
}
