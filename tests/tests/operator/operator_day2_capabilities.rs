//! A plugin that declares neither `power` nor `update` (the `machines` guest, on its loopback
//! backend) is never asked to stop, start or update: the VM says why in `Synced`, on the real
//! control plane with the real operator.

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use serde_json::json;
use vmop::api::{CredentialsMode, PowerState};
use vmop_tests::machines;
use vmop_tests::operator::Env;

use crate::day2::{condition, patch_vm};
use crate::operator_bin;

#[tokio::test]
async fn missing_capabilities_are_conditions_and_never_calls() -> anyhow::Result<()> {
    let env = Env::new("day2-caps").await?;
    let backend = machines::Backend::start(None).await?;
    std::fs::copy(
        vmop_tests::wasm::path("machines")?,
        env.plugin_dir.path().join("machines.wasm"),
    )?;
    let mut pc = env.provider_config("machines", "none");
    pc.spec.plugin.path = "machines.wasm".into();
    pc.spec.config = [("endpoint".to_owned(), backend.endpoint.clone())].into();
    pc.spec.credentials_secret_ref = None;
    pc.spec.credentials = CredentialsMode::Passthrough;
    pc.spec.allowed_hosts = vec![backend.endpoint.clone()];
    env.apply_provider_config(&pc).await?;
    let provider = pc.name_any();
    let operator = env.operator().start(operator_bin())?;

    let halted = env
        .vm("halted", &provider)
        .image(machines::IMAGE)
        .power_state(PowerState::Stopped);
    env.create_vm(halted).await?;
    env.create_vm(env.vm("resized", &provider).image(machines::IMAGE))
        .await?;

    let vm = env
        .wait_vm_condition("halted", "Synced", "False", Some("PowerNotSupported"))
        .await?;
    let (_, _, message) = condition(&vm, "Synced").context("no Synced")?;
    ensure!(
        message.contains("\"power\""),
        "message names no capability: {message}"
    );
    ensure!(
        condition(&vm, "Ready").is_some_and(|c| c.0 == "True"),
        "the machine itself is mirrored: {:?}",
        condition(&vm, "Ready")
    );

    env.wait_ready("resized").await?;
    patch_vm(&env, "resized", json!({"spec": {"memory": "1Gi"}})).await?;
    env.wait_vm_condition("resized", "Synced", "False", Some("UpdateNotSupported"))
        .await?;

    for name in ["halted", "resized"] {
        let asked: Vec<String> = operator
            .calls_for(name)
            .into_iter()
            .map(|c| c.op)
            .filter(|op| ["update", "start", "stop"].contains(&op.as_str()))
            .collect();
        ensure!(
            asked.is_empty(),
            "{name}: asked {asked:?} of a plugin that lacks them"
        );
    }
    ensure!(backend.live().len() == 2, "machines: {:?}", backend.live());
    Ok(())
}
