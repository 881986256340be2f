//! A crash between `create` and the status write must not duplicate the machine: the operator
//! process exits right after the plugin created the instance (test hook), a new one starts,
//! and moto still holds exactly one instance for the VM.

use std::path::Path;

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use vmop_tests::operator::Env;

fn operator_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vmop-operator"))
}

/// `vmop::controller::vm::EXIT_AFTER_CREATE_CODE`.
const EXIT_AFTER_CREATE: i32 = vmop::controller::vm::EXIT_AFTER_CREATE_CODE;

#[tokio::test]
async fn crash_after_create_does_not_duplicate_the_instance() -> anyhow::Result<()> {
    let env = Env::new("idempotency").await?;
    let provider = env.standard_provider("aws").await?;
    let created = env.create_vm(&env.vm("once", &provider)).await?;
    let uid = created.uid().context("created VM without uid")?;

    let mut crashing = env
        .operator()
        .env("VMOP_TEST_EXIT_AFTER_CREATE", "true")
        .start(operator_bin())?;
    let exit = crashing.wait_exit().await?;
    ensure!(
        exit.code() == Some(EXIT_AFTER_CREATE),
        "the operator exited with {exit:?}, not through the test hook; log:\n{}",
        crashing.log()
    );
    let creates = crashing
        .calls_for("once")
        .iter()
        .filter(|c| c.op == "create")
        .count();
    ensure!(creates == 1, "{creates} create calls before the crash");

    // The crash left a machine the status does not know about.
    let lost = env.vms().get("once").await?;
    let status = lost.status.unwrap_or_default();
    ensure!(
        status.id.is_none(),
        "status.id was written before the crash: {status:?}"
    );
    ensure!(
        status.create_pending,
        "createPending was not recorded before create: {status:?}"
    );
    let before = env.live_instances(&uid)?;
    ensure!(before.len() == 1, "instances after the crash: {before:?}");

    let restarted = env.operator().start(operator_bin())?;
    let ready = env.wait_ready("once").await?;
    let id = ready
        .status
        .and_then(|s| s.id)
        .context("Ready without id")?;
    ensure!(
        before == vec![id.clone()],
        "adopted {id}, moto had {before:?}"
    );
    let after = env.live_instances(&uid)?;
    ensure!(
        after == before,
        "instances after the restart: {after:?} (before: {before:?})"
    );
    let creates = restarted
        .calls_for("once")
        .iter()
        .filter(|c| c.op == "create")
        .count();
    ensure!(
        creates == 1,
        "the restarted operator called create {creates} times"
    );
    Ok(())
}
