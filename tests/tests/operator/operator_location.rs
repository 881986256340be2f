//! A ProviderConfig moved to another place (here its endpoint, to a second
//! moto) makes every `get` answer "not found". That is never read as "the machine is lost":
//! the VM shows `Synced=False`, reason `LocationChanged`, with an Event, and no machine is made
//! at the new place while the old one is untouched; reverting the ProviderConfig makes it
//! Synced again; `spec.acceptLocation` set to the new location makes one machine there and
//! leaves the old one alone, also when the VM is deleted.

use anyhow::{Context as _, ensure};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use vmop::api::{Limits, VirtualMachine};
use vmop_tests::moto::{AwsCredentials, Moto};
use vmop_tests::operator::{Env, UID_TAG};

use crate::operator_bin;

const GRACE_SECONDS: u32 = 2;

async fn point_at(env: &Env, provider: &str, endpoint: &str) -> anyhow::Result<()> {
    let patch = Patch::Merge(json!({ "spec": {
        "config": { "endpoint": endpoint },
        "allowedHosts": [endpoint],
    }}));
    env.provider_configs()
        .patch(provider, &PatchParams::default(), &patch)
        .await?;
    Ok(())
}

fn condition<'a>(
    vm: &'a VirtualMachine,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    vm.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// The double-quoted strings of `text` (the locations a `LocationChanged` message names).
fn quoted(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Waits until the operator has looked at VM `name` again (a `get`) at least `seconds` after
/// `since`, so that the creation grace period cannot be what held it back.
async fn wait_rechecked_after(
    operator: &vmop_tests::operator::Operator,
    name: &str,
    since: Timestamp,
    seconds: i64,
) -> anyhow::Result<()> {
    operator
        .wait_calls(
            &format!("a get of {name} {seconds}s after the move"),
            |calls| {
                calls.iter().any(|c| {
                    c.vm.ends_with(&format!("/{name}"))
                        && c.op == "get"
                        && c.timestamp
                            .parse::<Timestamp>()
                            .is_ok_and(|t| t.duration_since(since).as_secs() >= seconds)
                })
            },
        )
        .await
        .map(drop)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_moved_provider_config_is_never_read_as_a_lost_machine() -> anyhow::Result<()> {
    let env = Env::new("location").await?;
    let second = Moto::start()?;
    let credentials = AwsCredentials {
        access_key_id: "AKIDTESTTESTTESTTEST".to_owned(),
        secret_access_key: "not-checked".to_owned(),
    };
    env.create_secret("creds", &credentials).await?;
    let mut pc = env.provider_config("aws", "creds");
    pc.spec.limits = Limits {
        creation_grace_period_seconds: GRACE_SECONDS,
        ..Limits::default()
    };
    env.apply_provider_config(&pc).await?;
    let provider = pc.name_any();
    // A blocked VM is looked at again every second.
    let operator = env
        .operator()
        .args_from(["--permanent-retry-base", "1s"])
        .start(operator_bin())?;

    let created = env.create_vm(env.vm("web", &provider)).await?;
    let uid = created.uid().context("created VM without uid")?;
    let ready = env.wait_ready("web").await?;
    let status = ready.status.clone().context("Ready without status")?;
    let id = status.id.clone().context("Ready without id")?;
    let first_location = status.location.clone().context("Ready without location")?;

    // Moved: not lost.
    point_at(&env, &provider, &second.endpoint()).await?;
    let moved = env
        .wait_vm_condition("web", "Synced", "False", Some("LocationChanged"))
        .await?;
    let moved_at = Timestamp::now();
    let message = condition(&moved, "Synced")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let second_location = quoted(&message)
        .into_iter()
        .find(|l| *l != first_location)
        .with_context(|| format!("the LocationChanged message names no new location: {message}"))?;
    ensure!(
        message.contains(&first_location),
        "the message does not name the recorded location {first_location:?}: {message}"
    );
    env.wait_vm_event("web", "LocationChanged").await?;
    wait_rechecked_after(&operator, "web", moved_at, i64::from(GRACE_SECONDS) + 1).await?;
    let made_there = second.instance_ids_with_tag(UID_TAG, &uid)?;
    ensure!(
        made_there.is_empty(),
        "a machine was made at the new location: {made_there:?}"
    );
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("running"),
        "the first instance {id} is {state:?}"
    );
    let held = env.vms().get("web").await?;
    ensure!(
        held.status.as_ref().and_then(|s| s.id.as_deref()) == Some(id.as_str()),
        "status.id changed while moved: {:?}",
        held.status
    );

    // Reverted: Synced again, same machine.
    point_at(&env, &provider, &env.moto.endpoint()).await?;
    let synced = env.wait_vm_condition("web", "Synced", "True", None).await?;
    ensure!(
        synced.status.as_ref().and_then(|s| s.id.as_deref()) == Some(id.as_str()),
        "another id after the revert: {:?}",
        synced.status
    );
    env.wait_ready("web").await?;

    // Moved again and accepted: one machine at the new place, the old one left alone.
    point_at(&env, &provider, &second.endpoint()).await?;
    env.wait_vm_condition("web", "Synced", "False", Some("LocationChanged"))
        .await?;
    let accept = Patch::Merge(json!({ "spec": { "acceptLocation": second_location } }));
    env.vms()
        .patch("web", &PatchParams::default(), &accept)
        .await?;
    let moved_ready = env
        .wait_vm("web", "Ready at the new location", |vm| {
            vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
                s.location.as_deref() == Some(second_location.as_str())
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .await?
        .context("the VM vanished")?;
    let new_id = moved_ready
        .status
        .and_then(|s| s.id)
        .context("Ready without id")?;
    let there = second.instance_ids_with_tag(UID_TAG, &uid)?;
    ensure!(
        there == vec![new_id.clone()],
        "instances at the new location: {there:?}, the VM names {new_id}"
    );
    ensure!(new_id != id, "the new machine has the old id {id}");
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("running"),
        "the old instance {id} was touched: {state:?}"
    );

    env.vms().delete("web", &DeleteParams::default()).await?;
    env.wait_gone("web").await?;
    let new_state = second.instance_state(&new_id)?;
    ensure!(
        new_state.as_deref() == Some("terminated"),
        "the new instance {new_id} is {new_state:?} after deletion"
    );
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("running"),
        "the old instance {id}, no longer managed, was touched at deletion: {state:?}"
    );
    Ok(())
}
