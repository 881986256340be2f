//! `vmop plugin inspect|call` against real components, parsed by the real command line.

use std::path::Path;

use anyhow::Context as _;
use clap::Parser as _;
use serde_json::Value;
use vmop::cli::{Cli, Command};

async fn vmop_plugin(args: &[&str]) -> (anyhow::Result<()>, Value) {
    let argv = ["vmop", "plugin"].iter().chain(args);
    let cmd = match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Plugin(cmd),
            ..
        }) => cmd,
        other => {
            return (
                Err(anyhow::anyhow!("not a plugin command: {other:?}")),
                Value::Null,
            );
        }
    };
    let mut out = Vec::new();
    let result = vmop::cli::plugin::execute(cmd, &mut out).await;
    let json = serde_json::from_slice(&out).unwrap_or(Value::Null);
    (result, json)
}

fn guest(name: &str) -> anyhow::Result<String> {
    Ok(vmop_tests::wasm::path(name)?.display().to_string())
}

#[tokio::test]
async fn inspect_prints_identity_digest_and_imports() -> anyhow::Result<()> {
    let file = guest("hostile")?;
    let (result, json) = vmop_plugin(&["inspect", &file]).await;
    result?;
    assert_eq!(json["name"], "hostile");
    assert_eq!(json["version"], "0.1.0");
    assert_eq!(json["witVersion"], vmop::plugin::WIT_VERSION);
    let digest = json["sha256"].as_str().context("no digest")?;
    assert_eq!(digest.len(), 64);
    let imports: Vec<&str> = json["imports"]
        .as_array()
        .context("no imports")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        imports
            .iter()
            .any(|i| i.starts_with("wasi:http/outgoing-handler")),
        "{imports:?}"
    );
    assert!(
        imports.iter().any(|i| i.starts_with("vmop:provider/log")),
        "{imports:?}"
    );

    let wrong_pin = "f".repeat(64);
    let (result, _) = vmop_plugin(&["inspect", &file, "--pin", &wrong_pin]).await;
    let message = format!("{:#}", result.err().context("a wrong pin was accepted")?);
    assert!(
        message.contains("digest mismatch") && message.contains(digest),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn call_runs_create_get_and_delete() -> anyhow::Result<()> {
    let file = guest("trivial")?;
    let dir = tempfile::tempdir()?;
    let spec = dir.path().join("spec.yaml");
    std::fs::write(
        &spec,
        "name: web\nuid: u-1\nimage: img\ncpu: 2\nmemoryMib: 1024\n",
    )?;
    let spec = spec.display().to_string();

    let (result, json) = vmop_plugin(&[
        "call", &file, "create", "--spec", &spec, "--config", "region=x",
    ])
    .await;
    result?;
    assert_eq!(json["ok"]["id"], "vm-u-1");
    assert_eq!(json["ok"]["phase"], "Running");

    let (result, json) = vmop_plugin(&["call", &file, "get", "--id", "vm-u-1"]).await;
    result?;
    assert_eq!(json["ok"]["id"], "vm-u-1");
    let (result, json) = vmop_plugin(&["call", &file, "get", "--id", "other"]).await;
    result?;
    assert_eq!(json["ok"], Value::Null);
    let (result, json) = vmop_plugin(&["call", &file, "delete", "--id", "vm-u-1"]).await;
    result?;
    assert_eq!(json["ok"]["deleted"], "vm-u-1");
    Ok(())
}

#[tokio::test]
async fn call_reports_sandbox_failures_as_json() -> anyhow::Result<()> {
    let file = guest("hostile")?;
    let (result, json) = vmop_plugin(&[
        "call",
        &file,
        "get",
        "--id",
        "x",
        "--config",
        "mode=grow",
        "--memory",
        "16Mi",
    ])
    .await;
    assert!(result.is_err());
    assert_eq!(json["error"]["fault"], "Plugin");
    assert_eq!(json["error"]["class"], "TransientError");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("memory cap of 16777216"), "{message}");

    let (result, json) = vmop_plugin(&[
        "call",
        &file,
        "get",
        "--id",
        "x",
        "--config",
        "mode=http",
        "--config",
        "authority=127.0.0.1:9",
        "--allow-host",
        "https://*.example.com",
    ])
    .await;
    assert!(result.is_err());
    assert_eq!(json["error"]["fault"], "Provider");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("HttpRequestDenied"), "{message}");

    let (result, _) = vmop_plugin(&["call", &file, "create"]).await;
    assert!(result.is_err(), "create without --spec was accepted");
    assert!(Path::new(&file).is_file());
    Ok(())
}
