//! Adopting machines the operator did not create, on the real control plane, moto and ec2.wasm:
//! `spec.externalId` adopts an instance made directly in moto; one another VM manages is
//! refused with `AdoptionConflict`; `managementPolicy: ObserveOnly` makes no write call, and
//! deleting such a VM leaves the machine.

mod day2;

use anyhow::{Context as _, ensure};
use kube::api::DeleteParams;
use vmop::api::ManagementPolicy;
use vmop::api::PowerState;
use vmop_tests::operator::Env;

use day2::{condition, operator_bin, run_instance};

const WRITES: [&str; 5] = ["create", "update", "start", "stop", "delete"];

#[tokio::test]
async fn adopts_refuses_a_managed_machine_and_observes_without_writing() -> anyhow::Result<()> {
    let env = Env::new("day2-adopt").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    let outside = run_instance(&env.moto, "t3.nano")?;
    let watched = run_instance(&env.moto, "t3.nano")?;

    let mut adopted = env.vm("adopted", &provider);
    adopted.spec.external_id = Some(outside.clone());
    env.create_vm(&adopted).await?;
    let vm = env.wait_ready("adopted").await?;
    ensure!(
        vm.status.as_ref().and_then(|s| s.id.as_deref()) == Some(outside.as_str()),
        "adopted VM records {:?}",
        vm.status.as_ref().and_then(|s| s.id.as_deref())
    );
    let ops: Vec<String> = operator
        .calls_for("adopted")
        .into_iter()
        .map(|c| c.op)
        .collect();
    ensure!(
        !ops.iter().any(|o| o == "create"),
        "adoption created a machine: {ops:?}"
    );
    let reasons: Vec<String> = env
        .vm_events("adopted")
        .await?
        .into_iter()
        .map(|e| e.0)
        .collect();
    ensure!(
        reasons.iter().any(|r| r == "Adopted"),
        "no Adopted Event: {reasons:?}"
    );

    // Another VM naming the same machine is refused, and touches nothing.
    let mut thief = env.vm("thief", &provider);
    thief.spec.external_id = Some(outside.clone());
    env.create_vm(&thief).await?;
    let vm = env
        .wait_vm_condition("thief", "Synced", "False", Some("AdoptionConflict"))
        .await?;
    let (_, _, message) = condition(&vm, "Synced").context("no Synced")?;
    ensure!(
        message.contains("adopted"),
        "conflict message names no owner: {message}"
    );
    ensure!(
        vm.status.as_ref().and_then(|s| s.id.as_ref()).is_none(),
        "thief recorded an id"
    );
    let writes: Vec<String> = operator
        .calls_for("thief")
        .into_iter()
        .map(|c| c.op)
        .filter(|o| WRITES.contains(&o.as_str()))
        .collect();
    ensure!(writes.is_empty(), "thief made write calls: {writes:?}");

    // ObserveOnly: mirrored, never powered (even though the spec asks Stopped), left at deletion.
    let mut observer = env.vm("observer", &provider);
    observer.spec.external_id = Some(watched.clone());
    observer.spec.management_policy = ManagementPolicy::ObserveOnly;
    observer.spec.power_state = PowerState::Stopped;
    env.create_vm(&observer).await?;
    env.wait_ready("observer").await?;
    env.vms()
        .delete("observer", &DeleteParams::default())
        .await?;
    env.wait_gone("observer").await?;
    let writes: Vec<String> = operator
        .calls_for("observer")
        .into_iter()
        .map(|c| c.op)
        .filter(|o| WRITES.contains(&o.as_str()))
        .collect();
    ensure!(
        writes.is_empty(),
        "ObserveOnly made write calls: {writes:?}"
    );
    ensure!(
        env.moto.instance_state(&watched)?.as_deref() == Some("running"),
        "ObserveOnly deletion touched the machine"
    );
    Ok(())
}
