//! Launch-only parameters on the real control plane, moto and the real ec2.wasm: ec2 declares
//! `subnetId` (and the other launch settings) `mutable: false`, the ProviderConfig publishes
//! it, and a change after creation is refused before any call (`Synced=False`, reason
//! `InvalidSpec`, naming the parameter, a Warning Event), the instance untouched and
//! `status.applied` keeping the value it was made with; reverting the spec ends it.

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use serde_json::json;
use vmop::api::VirtualMachine;
use vmop_tests::operator::Env;

use crate::day2::{self, condition, instance_field, patch_vm, subnet};
use crate::operator_bin;

/// `status.applied.parameters.subnetId` of `vm`.
fn applied_subnet(vm: &VirtualMachine) -> Option<String> {
    vm.status
        .as_ref()?
        .applied
        .as_ref()?
        .parameters
        .get("subnetId")
        .cloned()
}

#[tokio::test]
async fn a_launch_only_parameter_change_is_refused_before_any_call_and_revert_clears_it()
-> anyhow::Result<()> {
    let env = Env::new("day2-launch-only").await?;
    let provider = env.standard_provider("aws").await?;
    let (subnet_a, subnet_b) = (subnet(&env.moto, 21)?, subnet(&env.moto, 22)?);
    let operator = env.operator().start(operator_bin())?;

    // Published: which parameters reach an existing machine.
    let parameters = day2::published_plugin(&env, &provider, "subnetId")
        .await?
        .parameters;
    let mutable = |name: &str| {
        parameters
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.mutable)
    };
    ensure!(
        mutable("instanceType") == Some(true) && mutable("subnetId") == Some(false),
        "published parameters: {parameters:?}"
    );

    let vm = env
        .vm("pinned", &provider)
        .parameter("subnetId", subnet_a.as_str());
    env.create_vm(vm).await?;
    let ready = env.wait_ready("pinned").await?;
    let id = ready
        .status
        .as_ref()
        .and_then(|s| s.id.clone())
        .context("Ready VM without id")?;
    ensure!(applied_subnet(&ready).as_deref() == Some(subnet_a.as_str()));
    let calls_before = operator.calls_for("pinned").len();

    // Moved to another subnet: refused, nothing asked of the plugin, the instance stays.
    let patched = patch_vm(
        &env,
        "pinned",
        json!({"spec": {"parameters": {"subnetId": subnet_b}}}),
    )
    .await?;
    let generation = patched.metadata.generation;
    let refused = env
        .wait_vm("pinned", "refused at the new generation", |vm| {
            vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Synced"
                        && c.status == "False"
                        && c.reason == "InvalidSpec"
                        && c.observed_generation == generation
                })
            })
        })
        .await?
        .context("the VM vanished")?;
    let (_, _, message) = condition(&refused, "Synced").context("no Synced")?;
    ensure!(
        message.contains("spec.parameters.subnetId") && message.contains(&subnet_b),
        "Synced message does not name the parameter: {message}"
    );
    ensure!(
        applied_subnet(&refused).as_deref() == Some(subnet_a.as_str()),
        "status.applied lost the subnet the machine was made in: {:?}",
        refused.status.as_ref().and_then(|s| s.applied.as_ref())
    );
    ensure!(
        refused.status.as_ref().and_then(|s| s.id.as_deref()) == Some(id.as_str()),
        "the recorded machine changed"
    );
    let calls: Vec<String> = operator
        .calls_for("pinned")
        .into_iter()
        .skip(calls_before)
        .map(|c| c.op)
        .collect();
    ensure!(calls.is_empty(), "plugin calls after the change: {calls:?}");
    let actual = instance_field(&env.moto, &id, "subnetId")?;
    ensure!(
        actual.as_deref() == Some(subnet_a.as_str()),
        "instance {id} moved to {actual:?}"
    );
    ensure!(
        env.moto.instance_state(&id)?.as_deref() == Some("running"),
        "the instance was touched"
    );
    env.wait_vm_event_where("pinned", "InvalidSpec naming subnetId", |reason, note| {
        reason == "InvalidSpec" && note.contains("subnetId")
    })
    .await?;
    ensure!(
        operator
            .log()
            .contains("refused a change of a launch-only parameter"),
        "no log line"
    );

    // Reverted: in sync again, with the same machine.
    let reverted = patch_vm(
        &env,
        "pinned",
        json!({"spec": {"parameters": {"subnetId": subnet_a}}}),
    )
    .await?;
    let generation = reverted.metadata.generation;
    let synced = env
        .wait_vm("pinned", "Synced again at the reverted generation", |vm| {
            vm.and_then(|vm| vm.status.as_ref()).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Synced" && c.status == "True" && c.observed_generation == generation
                })
            })
        })
        .await?
        .context("the VM vanished")?;
    ensure!(synced.status.as_ref().and_then(|s| s.id.as_deref()) == Some(id.as_str()));
    ensure!(applied_subnet(&synced).as_deref() == Some(subnet_a.as_str()));
    let writes: Vec<String> = operator
        .calls_for("pinned")
        .into_iter()
        .map(|c| c.op)
        .filter(|op| ["update", "stop", "start", "delete"].contains(&op.as_str()))
        .collect();
    ensure!(writes.is_empty(), "write calls: {writes:?}");
    ensure!(
        env.live_instances(&synced.uid().context("no uid")?)? == [id.clone()],
        "one instance, the first"
    );
    Ok(())
}
