//! Adopting machines the operator did not create, on the real control plane, moto and ec2.wasm:
//! `spec.externalId` adopts an instance made directly in moto; one another VM manages is
//! refused with `AdoptionConflict`; `managementPolicy: ObserveOnly` makes no write call, and
//! deleting such a VM leaves the machine.
//!
//! Ownership in the cloud (`vm-status.owner`, ec2's `vmop.dev/uid` tag): a machine launched by
//! a VM that is no longer in the cluster is still refused, and the refused VM's deletion leaves
//! it; an adopted machine is tagged as its VM's; one whose tag later names another uid is left
//! alone (and left at deletion); two VMs adopting one untagged machine end with one owner.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kube::ResourceExt;
use kube::api::DeleteParams;
use vmop::api::{DeletionPolicy, ManagementPolicy, PowerState, VirtualMachine};
use vmop_tests::operator::{DEADLINE, Env};

use crate::day2::{condition, run_instance};
use crate::operator_bin;

const WRITES: [&str; 5] = ["create", "update", "start", "stop", "delete"];

#[tokio::test]
async fn adopts_refuses_a_managed_machine_and_observes_without_writing() -> anyhow::Result<()> {
    let env = Env::new("day2-adopt").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env.operator().start(operator_bin())?;
    let outside = run_instance(&env.moto, "t3.nano")?;
    let watched = run_instance(&env.moto, "t3.nano")?;

    env.create_vm(env.vm("adopted", &provider).external_id(&outside))
        .await?;
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
    env.wait_vm_event("adopted", "Adopted").await?;

    // Another VM naming the same machine is refused, and touches nothing.
    env.create_vm(env.vm("thief", &provider).external_id(&outside))
        .await?;
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
    let observer = env
        .vm("observer", &provider)
        .external_id(&watched)
        .management_policy(ManagementPolicy::ObserveOnly)
        .power_state(PowerState::Stopped);
    env.create_vm(observer).await?;
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

const UID_TAG: &str = "vmop.dev/uid";

/// Polls `check` (moto or several objects at once, which no single watch covers) until it
/// answers `Some`, or fails after [`DEADLINE`] with `what`.
async fn until<T>(
    what: &str,
    mut check: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(found) = check().await? {
            return Ok(found);
        }
        if start.elapsed() > DEADLINE {
            bail!("not {what} within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether moto's instance `id` is running and tagged `vmop.dev/uid=uid`.
fn tagged(env: &Env, id: &str, uid: &str) -> anyhow::Result<bool> {
    Ok(env
        .moto
        .instance_ids_with_tag(UID_TAG, uid)?
        .iter()
        .any(|i| i == id)
        && env.moto.instance_state(id)?.as_deref() == Some("running"))
}

fn ops(operator: &vmop_tests::operator::Operator, name: &str, op: &str) -> usize {
    operator
        .calls_for(name)
        .iter()
        .filter(|c| c.op == op)
        .count()
}

fn synced_reason(vm: &VirtualMachine) -> Option<(String, String)> {
    condition(vm, "Synced").map(|(status, reason, _)| (status, reason))
}

#[tokio::test]
async fn the_cloud_tag_outlives_its_vm_and_another_vms_machine_is_never_touched()
-> anyhow::Result<()> {
    let env = Env::new("day2-owner").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env
        .operator()
        .args_from(["--resync-period", "2s"])
        .start(operator_bin())?;

    // A machine launched by VM `first`, which then leaves the cluster (Orphan): tagged with
    // its uid, and no VirtualMachine records it any more.
    let first = env
        .vm("first", &provider)
        .deletion_policy(DeletionPolicy::Orphan);
    env.create_vm(first).await?;
    let vm = env.wait_ready("first").await?;
    let first_uid = vm.uid().context("no uid")?;
    let id = vm.status.and_then(|s| s.id).context("no id")?;
    env.vms().delete("first", &DeleteParams::default()).await?;
    env.wait_gone("first").await?;
    ensure!(
        tagged(&env, &id, &first_uid)?,
        "the orphaned instance lost its tag"
    );

    // `second` names it: refused on the tag alone, no write, and its deletion leaves it.
    env.create_vm(env.vm("second", &provider).external_id(&id))
        .await?;
    let vm = env
        .wait_vm_condition("second", "Synced", "False", Some("AdoptionConflict"))
        .await?;
    let (_, _, message) = condition(&vm, "Synced").context("no Synced")?;
    ensure!(
        message.contains(&first_uid),
        "the conflict does not name the owner's uid: {message}"
    );
    ensure!(
        vm.status.as_ref().and_then(|s| s.id.as_ref()).is_none(),
        "second recorded the machine"
    );
    env.wait_vm_event("second", "AdoptionConflict").await?;
    env.vms().delete("second", &DeleteParams::default()).await?;
    env.wait_gone("second").await?;
    let writes: Vec<String> = operator
        .calls_for("second")
        .into_iter()
        .map(|c| c.op)
        .filter(|o| WRITES.contains(&o.as_str()))
        .collect();
    ensure!(writes.is_empty(), "second made write calls: {writes:?}");
    ensure!(
        tagged(&env, &id, &first_uid)?,
        "second's deletion touched the machine"
    );

    // `keeper` adopts an untagged machine and claims it (the tag names keeper now) ...
    let outside = run_instance(&env.moto, "t3.nano")?;
    env.create_vm(env.vm("keeper", &provider).external_id(&outside))
        .await?;
    let keeper_uid = env.wait_ready("keeper").await?.uid().context("no uid")?;
    until("tagged as keeper's", async || {
        Ok(tagged(&env, &outside, &keeper_uid)?.then_some(()))
    })
    .await?;
    // ... until someone else's VM (another cluster, say) claims it: keeper lets go.
    env.moto.ec2(
        "CreateTags",
        &[
            ("ResourceId.1", outside.as_str()),
            ("Tag.1.Key", UID_TAG),
            ("Tag.1.Value", "uid-of-another-cluster"),
        ],
    )?;
    let vm = env
        .wait_vm_condition("keeper", "Synced", "False", Some("AdoptionConflict"))
        .await?;
    let (_, _, message) = condition(&vm, "Synced").context("no Synced")?;
    ensure!(message.contains("uid-of-another-cluster"), "{message}");
    env.vms().delete("keeper", &DeleteParams::default()).await?;
    env.wait_gone("keeper").await?;
    ensure!(ops(&operator, "keeper", "delete") == 0, "keeper deleted it");
    ensure!(
        tagged(&env, &outside, "uid-of-another-cluster")?,
        "keeper's deletion touched the machine"
    );
    env.wait_vm_event("keeper", "OwnedElsewhere").await?;
    Ok(())
}

#[tokio::test]
async fn two_vms_adopting_one_untagged_machine_end_with_exactly_one_owner() -> anyhow::Result<()> {
    let env = Env::new("day2-race").await?;
    let provider = env.standard_provider("aws").await?;
    let operator = env
        .operator()
        .args_from(["--resync-period", "2s"])
        .start(operator_bin())?;
    let shared = run_instance(&env.moto, "t3.nano")?;
    for name in ["left", "right"] {
        env.create_vm(env.vm(name, &provider).external_id(&shared))
            .await?;
    }

    // One is in sync and owns the tag, the other is refused, whichever won.
    let synced = Some(("True".to_owned(), "ReconcileSucceeded".to_owned()));
    let conflict = Some(("False".to_owned(), "AdoptionConflict".to_owned()));
    let (winner, loser) = until("one owner and one conflict", async || {
        let left = env.vms().get("left").await?;
        let right = env.vms().get("right").await?;
        let (winner, loser) = match (synced_reason(&left), synced_reason(&right)) {
            (l, r) if l == synced && r == conflict => (left, right),
            (l, r) if l == conflict && r == synced => (right, left),
            _ => return Ok(None),
        };
        let uid = winner.uid().context("no uid")?;
        Ok(tagged(&env, &shared, &uid)?.then_some((winner, loser)))
    })
    .await?;
    let winner_name = winner.name_any();
    let loser_name = loser.name_any();
    // Which check refused the loser depends on timing: the other VM's status.id in the
    // cluster, or the tag in the cloud when both adopted at once. Either way, only one owns it.
    let (_, _, message) = condition(&loser, "Synced").context("no Synced")?;
    eprintln!("{winner_name} owns {shared}; {loser_name}: {message}");
    ensure!(
        winner.status.as_ref().and_then(|s| s.id.as_deref()) == Some(shared.as_str()),
        "the winner does not record the machine"
    );

    // The loser's deletion leaves the machine to the winner.
    env.vms()
        .delete(&loser_name, &DeleteParams::default())
        .await?;
    env.wait_gone(&loser_name).await?;
    ensure!(
        ops(&operator, &loser_name, "delete") == 0,
        "the loser deleted the machine"
    );
    let winner_uid = winner.uid().context("no uid")?;
    ensure!(
        tagged(&env, &shared, &winner_uid)?,
        "the loser's deletion touched the machine"
    );
    let vm = env.wait_ready(&winner_name).await?;
    ensure!(
        synced_reason(&vm) == synced,
        "the winner is no longer in sync: {:?}",
        condition(&vm, "Synced")
    );
    Ok(())
}
