//! A lost create response followed by another error class, and the crash after create, on
//! the real parts: the plugin talks to moto through the fault proxy, which forwards
//! `RunInstances` (moto makes the instance) and drops its answer, so the create is in flight
//! with a machine the operator has not heard of; the operator is then SIGKILLed.
//!
//! - Restarted with the proxy passing everything (same location), the operator ends with
//!   exactly one instance for the VM's uid and the VM Ready with that id.
//! - Restarted while every EC2 call is refused with another error class (`AuthFailure`,
//!   `RequestLimitExceeded`) and then deleted, the VM keeps its finalizer while the cloud cannot
//!   be asked, deletion never calls `create`, and once the cloud answers again the instance is
//!   terminated and the finalizer released: no leak.

use std::time::Instant;

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use kube::api::DeleteParams;
use vmop::api::{CREATE_LOCATION, Limits, VM_FINALIZER};
use vmop_tests::faults::{Cut, Fault, FaultProxy, Outcome, Rule};
use vmop_tests::moto::AwsCredentials;
use vmop_tests::operator::{DEADLINE, Env, OperatorArgs, UID_TAG};

use crate::operator_bin;

/// Short, so absence may be believed soon after a restart; the tests never depend on it
/// being short except for speed.
const GRACE_SECONDS: u32 = 2;

/// A test's world: moto behind a fault proxy, one ProviderConfig through the proxy.
struct World {
    env: Env,
    proxy: FaultProxy,
    provider: String,
}

async fn world(prefix: &str) -> anyhow::Result<World> {
    let env = Env::new(prefix).await?;
    let proxy = FaultProxy::to_port(env.moto.port())?;
    let credentials = AwsCredentials {
        access_key_id: "AKIDTESTTESTTESTTEST".to_owned(),
        secret_access_key: "not-checked".to_owned(),
    };
    env.create_secret("creds", &credentials).await?;
    let mut pc = env.provider_config("aws", "creds");
    pc.spec
        .config
        .insert("endpoint".to_owned(), proxy.endpoint());
    pc.spec.allowed_hosts = vec![proxy.endpoint()];
    pc.spec.limits = Limits {
        creation_grace_period_seconds: GRACE_SECONDS,
        ..Limits::default()
    };
    env.apply_provider_config(&pc).await?;
    Ok(World {
        provider: pc.name_any(),
        env,
        proxy,
    })
}

/// Slow retries (refused credentials) come back after 1 s, not minutes.
fn operator(env: &Env) -> OperatorArgs {
    env.operator()
        .args_from(["--permanent-retry-base", "1s", "--poll-interval", "1s"])
}

/// Creates VM `name`, lets its `RunInstances` reach moto with the answer dropped, and kills
/// the operator while that create is in flight. Returns the VM's uid and the one instance
/// moto made.
async fn crash_during_lost_create(w: &World, name: &str) -> anyhow::Result<(String, String)> {
    w.proxy
        .set([Rule::on(&["RunInstances"], Fault::DropResponse(Cut::Hold))]);
    let mut crashing = operator(&w.env).start(operator_bin())?;
    let created = w.env.create_vm(w.env.vm(name, &w.provider)).await?;
    let uid = created.uid().context("created VM without uid")?;
    w.proxy
        .wait_records(
            "RunInstances forwarded, its answer dropped",
            DEADLINE,
            |records| {
                records.iter().any(|r| {
                    r.action == "RunInstances"
                        && r.tag(UID_TAG) == Some(uid.as_str())
                        && matches!(r.outcome, Outcome::ResponseDropped { status: 200, .. })
                })
            },
        )
        .await?;
    let in_flight = crashing
        .calls_for(name)
        .iter()
        .filter(|c| c.op == "create")
        .count();
    crashing.kill().await?;
    ensure!(
        in_flight == 0,
        "the create ended before the kill (it should have been in flight): {:#?}",
        crashing.calls_for(name)
    );

    // What the crash left: a machine the status does not name, and a finalizer saying where
    // creates of this VM go.
    let made = w.env.live_instances(&uid)?;
    ensure!(made.len() == 1, "instances after the crash: {made:?}");
    let left = w.env.vms().get(name).await?;
    let status = left.status.clone().unwrap_or_default();
    ensure!(
        status.id.is_none(),
        "status.id written without a create answer: {status:?}"
    );
    ensure!(
        left.finalizers().iter().any(|f| f == VM_FINALIZER),
        "no finalizer before the create: {:?}",
        left.finalizers()
    );
    ensure!(
        left.annotations().contains_key(CREATE_LOCATION),
        "no {CREATE_LOCATION} annotation before the create: {:?}",
        left.annotations()
    );
    let id = made.into_iter().next().context("no instance")?;
    Ok((uid, id))
}

/// Crash after create: SIGKILL while the create's answer is lost, restart with the same
/// location: one instance, adopted.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_while_a_create_answer_is_lost_leaves_exactly_one_instance() -> anyhow::Result<()> {
    let w = world("idem-kill").await?;
    let (uid, id) = crash_during_lost_create(&w, "once").await?;

    w.proxy.heal();
    let restarted = operator(&w.env).start(operator_bin())?;
    let ready = w.env.wait_ready("once").await?;
    let status = ready.status.clone().context("Ready without status")?;
    ensure!(
        status.id.as_deref() == Some(id.as_str()),
        "Ready with {:?}, moto made {id}",
        status.id
    );
    let ever = w.env.moto.instance_ids_with_tag(UID_TAG, &uid)?;
    ensure!(
        ever == vec![id.clone()],
        "instances ever made for {uid}: {ever:?} (one expected: {id})"
    );
    ensure!(
        status.location.is_some()
            && status.location.as_deref()
                == ready.annotations().get(CREATE_LOCATION).map(|s| s.as_str()),
        "status.location {:?} is not where creates went ({:?})",
        status.location,
        ready.annotations().get(CREATE_LOCATION)
    );
    let run_instances = w
        .proxy
        .records()
        .into_iter()
        .filter(|r| r.action == "RunInstances")
        .count();
    ensure!(
        run_instances == 1,
        "RunInstances reached moto {run_instances} times: the retry launched again\n{}",
        vmop_tests::faults::summary(&w.proxy.records())
    );
    drop(restarted);
    Ok(())
}

/// The lost create, then the next attempts fail with `fault` (another class,
/// `reason`), then the VM is deleted. Nothing may be released while the cloud cannot be asked;
/// deletion never creates; after healing the instance is terminated and the finalizer dropped.
async fn lost_create_then(prefix: &str, fault: Fault, reason: &str) -> anyhow::Result<()> {
    let w = world(prefix).await?;
    let name = "leak";
    let (uid, id) = crash_during_lost_create(&w, name).await?;

    w.proxy.set([Rule::every(fault)]);
    let operator = operator(&w.env).start(operator_bin())?;
    let refused = |calls: &[vmop_tests::operator::ProviderCall]| {
        calls
            .iter()
            .filter(|c| {
                // The restarted operator looks for the machine the lost create may have made
                // (`find`) before it would create again: either is refused.
                c.vm.ends_with(&format!("/{name}"))
                    && (c.op == "create" || c.op == "find")
                    && c.outcome == reason
            })
            .count()
    };
    operator
        .wait_calls(&format!("a find or create refused as {reason}"), |calls| {
            refused(calls) >= 1
        })
        .await?;

    w.env.vms().delete(name, &DeleteParams::default()).await?;
    let deleted_at = Instant::now();
    operator
        .wait_calls(
            "the deletion asking find while the cloud refuses",
            |calls| {
                // Only a deletion asks `find` for a VM without an id.
                calls.iter().any(|c| {
                    c.vm.ends_with(&format!("/{name}")) && c.op == "find" && c.outcome == reason
                })
            },
        )
        .await?;
    let held = w.env.vms().get_opt(name).await?;
    ensure!(
        held.as_ref()
            .is_some_and(|vm| vm.finalizers().iter().any(|f| f == VM_FINALIZER)),
        "the finalizer was released while the cloud could not be asked: {held:#?}"
    );
    ensure!(
        w.env.live_instances(&uid)? == vec![id.clone()],
        "moto's instances changed while refusing: {:?}",
        w.env.live_instances(&uid)?
    );

    w.proxy.heal();
    w.env.wait_gone(name).await?;
    let state = w.env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "the lost instance {id} is {state:?} after the VM was deleted: leaked"
    );
    let ever = w.env.moto.instance_ids_with_tag(UID_TAG, &uid)?;
    ensure!(
        ever == vec![id.clone()],
        "instances ever made for {uid}: {ever:?}"
    );
    // The VM is never reconciled twice at once, so its calls are logged in order: a create
    // still running when the deletion arrived comes before the deletion's first `find`.
    let calls = operator.calls_for(name);
    let creates_in_deletion = calls
        .iter()
        .skip_while(|c| c.op != "find")
        .filter(|c| c.op == "create")
        .count();
    ensure!(
        creates_in_deletion == 0,
        "deletion called create: {calls:#?}"
    );
    let launched_after = w
        .proxy
        .records()
        .into_iter()
        .filter(|r| r.action == "RunInstances" && r.at > deleted_at)
        .count();
    ensure!(
        launched_after == 0,
        "RunInstances reached moto during the deletion"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_create_then_refused_credentials_then_deletion_leaks_nothing() -> anyhow::Result<()> {
    lost_create_then("idem-auth", Fault::auth_failure(), "Unauthorized").await
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_create_then_throttling_then_deletion_leaks_nothing() -> anyhow::Result<()> {
    lost_create_then(
        "idem-throttle",
        Fault::request_limit_exceeded(),
        "RateLimited",
    )
    .await
}
