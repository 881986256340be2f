//! The plugin file as the operator sees it: a change to it re-enqueues the ProviderConfigs and
//! VMs using it; a sha256 pin that does not match means no calls and a clear condition.

use anyhow::{Context as _, ensure};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use sha2::{Digest, Sha256};
use vmop::api::ProviderConfig;
use vmop_tests::operator::{Env, PLUGIN_FILE, wait_for};

use crate::operator_bin;

/// Replaces the plugin file atomically (a new inode, as a volume update does).
fn replace_plugin(env: &Env, contents: &[u8]) -> anyhow::Result<()> {
    let staged = env.plugin_dir.path().join(".staged");
    std::fs::write(&staged, contents)?;
    std::fs::rename(&staged, env.plugin_dir.path().join(PLUGIN_FILE))?;
    Ok(())
}

async fn wait_provider_config_ready(
    env: &Env,
    name: &str,
    status: &str,
    reason: &str,
) -> anyhow::Result<()> {
    wait_for(
        env.provider_configs(),
        name,
        &format!("Ready={status} ({reason})"),
        |pc: Option<&ProviderConfig>| {
            pc.and_then(|pc| pc.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == status && c.reason == reason)
            })
        },
    )
    .await
    .map(drop)
}

#[tokio::test]
async fn plugin_file_change_reenqueues_its_vms() -> anyhow::Result<()> {
    let env = Env::new("plugin-change").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env
        .operator()
        .args_from(["--plugin-poll-interval", "1s"])
        .start(operator_bin())?;
    env.create_vm(env.vm("watched", &provider)).await?;
    env.wait_ready("watched").await?;
    let good = std::fs::read(env.plugin_dir.path().join(PLUGIN_FILE))?;

    // A Ready VM is not looked at again before the resync period (5 minutes by default):
    // only the file change can make it notice.
    replace_plugin(&env, b"not a WebAssembly component")?;
    let broken = env
        .wait_vm_condition("watched", "Synced", "False", Some("PluginNotLoaded"))
        .await?;
    ensure!(
        broken.status.is_some_and(|s| s.id.is_some()),
        "the VM lost its id while the plugin was broken"
    );
    wait_provider_config_ready(&env, &provider, "False", "PluginNotLoaded").await?;

    replace_plugin(&env, &good)?;
    env.wait_vm_condition("watched", "Synced", "True", None)
        .await?;
    wait_provider_config_ready(&env, &provider, "True", "PluginLoaded").await?;
    Ok(())
}

#[tokio::test]
async fn pin_mismatch_blocks_every_call_until_fixed() -> anyhow::Result<()> {
    let env = Env::new("plugin-pin").await?;
    let provider = env.standard_provider("aws").await?;
    let patch = Patch::Merge(json!({ "spec": { "plugin": { "sha256": "0".repeat(64) } } }));
    env.provider_configs()
        .patch(&provider, &PatchParams::default(), &patch)
        .await?;
    let operator = env.operator().start(operator_bin())?;

    env.create_vm(env.vm("pinned", &provider)).await?;
    let blocked = env
        .wait_vm_condition("pinned", "Synced", "False", Some("PluginDigestMismatch"))
        .await?;
    let message = blocked
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Synced"))
        .map(|c| c.message)
        .unwrap_or_default();
    ensure!(
        message.contains("digest mismatch"),
        "Synced message: {message}"
    );
    wait_provider_config_ready(&env, &provider, "False", "PluginDigestMismatch").await?;
    ensure!(
        operator.calls_for("pinned").is_empty(),
        "calls through a mismatched plugin: {:?}",
        operator.calls_for("pinned")
    );

    let wasm = std::fs::read(env.plugin_dir.path().join(PLUGIN_FILE))?;
    let digest = hex::encode(Sha256::digest(&wasm));
    let patch = Patch::Merge(json!({ "spec": { "plugin": { "sha256": digest } } }));
    env.provider_configs()
        .patch(&provider, &PatchParams::default(), &patch)
        .await?;
    let ready = env.wait_ready("pinned").await?;
    ensure!(
        ready.status.and_then(|s| s.id).is_some(),
        "Ready without id"
    );
    let pc = env.provider_configs().get(&provider).await?;
    let loaded = pc
        .status
        .and_then(|s| s.plugin)
        .context("no plugin status")?;
    ensure!(
        loaded.digest == digest,
        "status digest {} != {digest}",
        loaded.digest
    );
    Ok(())
}
