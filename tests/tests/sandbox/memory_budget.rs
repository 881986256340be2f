//! The operator's memory limit covers its worst case (deploy/README.md, "Memory budget"):
//! `--max-plugin-instances` × (the engine's instance cap + host side) + headroom ≤ the limit, for
//! the plain Deployment, the init-container alternative and the chart's defaults.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_norway::Value;
use vmop::plugin::EngineConfig;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn yaml(path: &str) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(repo().join(path)).with_context(|| path.to_owned())?;
    Ok(serde_norway::from_str(&text)?)
}

/// `3Gi`, `512Mi` in bytes.
fn quantity(q: &str) -> anyhow::Result<u64> {
    let (number, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = number.parse()?;
    let factor = match unit {
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "" => 1,
        other => bail!("unexpected unit {other}"),
    };
    Ok(n * factor)
}

/// The value at `path` (mapping keys, or sequence indices written as numbers).
fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(value, |v, key| match key.parse::<usize>() {
            Ok(i) => v.as_sequence()?.get(i),
            Err(_) => v.get(*key),
        })
}

fn budget(instances: u32) -> u64 {
    EngineConfig {
        max_instances: instances,
        ..EngineConfig::default()
    }
    .memory_budget()
}

fn check_deployment(path: &str) -> anyhow::Result<()> {
    let doc = yaml(path)?;
    let container = at(&doc, &["spec", "template", "spec", "containers", "0"])
        .with_context(|| format!("{path}: no container"))?;
    let instances: u32 = at(container, &["args"])
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--max-plugin-instances="))
        .with_context(|| format!("{path}: no --max-plugin-instances"))?
        .parse()?;
    let limit = quantity(
        at(container, &["resources", "limits", "memory"])
            .and_then(Value::as_str)
            .with_context(|| format!("{path}: no memory limit"))?,
    )?;
    assert!(
        budget(instances) <= limit,
        "{path}: {instances} instances need {} MiB, the limit is {} MiB",
        budget(instances) >> 20,
        limit >> 20
    );
    Ok(())
}

#[test]
fn deployments_fit_their_worst_case() -> anyhow::Result<()> {
    check_deployment("deploy/deployment.yaml")?;
    check_deployment("deploy/alternatives/deployment-plugins-init-container.yaml")
}

#[test]
fn chart_defaults_fit_their_worst_case() -> anyhow::Result<()> {
    let values = yaml("charts/vmop/values.yaml")?;
    let instances = at(&values, &["maxPluginInstances"])
        .and_then(Value::as_u64)
        .context("maxPluginInstances")?;
    let limit = quantity(
        at(&values, &["resources", "limits", "memory"])
            .and_then(Value::as_str)
            .context("resources.limits.memory")?,
    )?;
    assert!(budget(u32::try_from(instances)?) <= limit);
    Ok(())
}
