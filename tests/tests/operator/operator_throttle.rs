//! Rate limits and deletion on the real parts: a throttled ProviderConfig holds no worker, so
//! it neither stalls another ProviderConfig's VMs nor starves its own VMs' multi-call
//! reconciles; and deleting a VM whose create never succeeded calls no `create`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::future::try_join_all;
use kube::ResourceExt;
use kube::api::DeleteParams;
use vmop::api::Limits;
use vmop_tests::faults::{Fault, FaultProxy, Rule};
use vmop_tests::moto::AwsCredentials;
use vmop_tests::operator::{Env, UID_TAG};

use crate::operator_bin;

const GRACE_SECONDS: u32 = 2;
const THROTTLED_VMS: usize = 100;
const MEASURED_VMS: usize = 10;

fn credentials() -> AwsCredentials {
    AwsCredentials {
        access_key_id: "AKIDTESTTESTTESTTEST".to_owned(),
        secret_access_key: "not-checked".to_owned(),
    }
}

/// ProviderConfig `suffix` on `endpoint` with `limits`; returns its name.
async fn provider(
    env: &Env,
    suffix: &str,
    endpoint: &str,
    limits: Limits,
) -> anyhow::Result<String> {
    let secret = format!("creds-{suffix}");
    env.create_secret(&secret, &credentials()).await?;
    let mut pc = env.provider_config(suffix, &secret);
    pc.spec
        .config
        .insert("endpoint".to_owned(), endpoint.to_owned());
    pc.spec.allowed_hosts = vec![endpoint.to_owned()];
    pc.spec.limits = limits;
    env.apply_provider_config(&pc).await?;
    Ok(pc.name_any())
}

/// Creates `count` VMs `<prefix>-<i>` on `provider` at once.
async fn create_vms(
    env: &Env,
    provider: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    try_join_all(
        names
            .iter()
            .map(|name| async move { env.create_vm(env.vm(name, provider)).await }),
    )
    .await?;
    Ok(names)
}

/// Creates `count` VMs on `provider` and measures the time until every one is Ready.
async fn time_to_ready(
    env: &Env,
    provider: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let names = create_vms(env, provider, prefix, count).await?;
    try_join_all(names.iter().map(|name| env.wait_ready(name))).await?;
    Ok(started.elapsed())
}

fn ready_count(vms: &[vmop::api::VirtualMachine], prefix: &str) -> usize {
    vms.iter()
        .filter(|vm| vm.name_any().starts_with(prefix))
        .filter(|vm| {
            vm.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .count()
}

/// A ProviderConfig limited to 1 request/s with 100 VMs due holds no worker: another
/// ProviderConfig's 10 VMs become Ready about as fast next to it as alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_provider_config_does_not_delay_another() -> anyhow::Result<()> {
    let env = Env::new("throttle").await?;
    let endpoint = env.moto.endpoint();
    let slow = provider(
        &env,
        "slow",
        &endpoint,
        Limits {
            requests_per_second: 1,
            burst: 1,
            creation_grace_period_seconds: GRACE_SECONDS,
            ..Limits::default()
        },
    )
    .await?;
    let fast = provider(
        &env,
        "fast",
        &endpoint,
        Limits {
            requests_per_second: 1000,
            burst: 1000,
            creation_grace_period_seconds: GRACE_SECONDS,
            ..Limits::default()
        },
    )
    .await?;
    let operator = env.operator().start(operator_bin())?;

    // Warm-up (plugin compiled, location known), so the floor measures VMs, not start-up.
    time_to_ready(&env, &fast, "warm", 1).await?;
    let alone = time_to_ready(&env, &fast, "alone", MEASURED_VMS).await?;

    create_vms(&env, &slow, "slow", THROTTLED_VMS).await?;
    // The slow VMs are queued on their token bucket before the measured ones arrive.
    operator
        .wait_calls("the throttled ProviderConfig at work", |calls| {
            calls.iter().filter(|c| c.provider == slow).count() >= 3
        })
        .await?;
    let beside = time_to_ready(&env, &fast, "beside", MEASURED_VMS).await?;
    let vms = env.vms().list(&Default::default()).await?.items;
    let slow_ready = ready_count(&vms, "slow-");
    let slow_calls = operator
        .provider_calls()
        .iter()
        .filter(|c| c.provider == slow)
        .count();

    eprintln!("\n== {MEASURED_VMS} VMs of an unthrottled ProviderConfig ==");
    eprintln!(
        "  alone:                                       {:6.2} s",
        alone.as_secs_f64()
    );
    eprintln!(
        "  beside {THROTTLED_VMS} VMs of a 1 request/s ProviderConfig: {:6.2} s",
        beside.as_secs_f64()
    );
    eprintln!(
        "  (meanwhile the throttled ProviderConfig made {slow_calls} calls, {slow_ready}/{THROTTLED_VMS} VMs Ready)"
    );
    ensure!(
        slow_ready < THROTTLED_VMS / 2,
        "the throttled ProviderConfig was not throttled ({slow_ready} VMs Ready): the comparison proves nothing"
    );
    let bound = alone * 3 + Duration::from_secs(5);
    ensure!(
        beside <= bound,
        "the throttled ProviderConfig delayed the other: {:.2}s beside it, {:.2}s alone (bound {:.2}s)",
        beside.as_secs_f64(),
        alone.as_secs_f64(),
        bound.as_secs_f64()
    );
    Ok(())
}

/// A VM whose create never succeeded is deleted without any `create` during its
/// deletion. The first attempt fails transiently (HTTP 500 on `RunInstances`: it may have made
/// a machine), and a create at deletion would now be refused for good (`InstanceLimitExceeded`):
/// the deletion asks `find` instead, and the finalizer goes once the grace period has passed.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_vm_whose_create_never_succeeded_calls_no_create() -> anyhow::Result<()> {
    let env = Env::new("no-create").await?;
    let proxy = FaultProxy::to_port(env.moto.port())?;
    let provider = provider(
        &env,
        "aws",
        &proxy.endpoint(),
        Limits {
            creation_grace_period_seconds: GRACE_SECONDS,
            ..Limits::default()
        },
    )
    .await?;
    proxy.set([Rule::on(&["RunInstances"], Fault::status(500))]);
    let operator = env.operator().start(operator_bin())?;
    let created = env.create_vm(env.vm("never", &provider)).await?;
    let uid = created.uid().context("created VM without uid")?;
    operator
        .wait_calls("a create failed transiently", |calls| {
            calls.iter().any(|c| {
                c.vm.ends_with("/never") && c.op == "create" && c.outcome == "TransientError"
            })
        })
        .await?;

    // Deleted while its last attempt failed transiently (it may have made a machine); from
    // now on a create would be refused for good (a quota), as a create at deletion time can be.
    env.vms().delete("never", &DeleteParams::default()).await?;
    proxy.set([Rule::on(
        &["RunInstances"],
        Fault::Ec2Error {
            status: 400,
            code: "InstanceLimitExceeded".to_owned(),
        },
    )]);
    env.wait_gone("never").await?;

    // The VM is never reconciled twice at once, so its calls are logged in order: a create
    // still running when the deletion arrived comes before the first `find` (a VM without an
    // id is asked about with `find` only once a create of unknown outcome was made).
    let calls = operator.calls_for("never");
    ensure!(
        calls.iter().any(|c| c.op == "find"),
        "the deletion did not look the machine up with find: {calls:#?}"
    );
    let creates_in_deletion = calls
        .iter()
        .skip_while(|c| c.op != "find")
        .filter(|c| c.op == "create")
        .count();
    ensure!(
        creates_in_deletion == 0,
        "deletion called create: {calls:#?}"
    );
    let ever = env.moto.instance_ids_with_tag(UID_TAG, &uid)?;
    ensure!(
        ever.is_empty(),
        "instances for a VM never created: {ever:?}"
    );
    Ok(())
}

/// The other side of "rate limits hold no worker": a throttled VM is requeued for its
/// token, and must still get through a reconcile that needs more than one call. On a
/// ProviderConfig whose bucket holds one token (1 request/s, burst 1), deleting a Ready VM
/// takes a `get` and a `delete` (and a `get` to see it go): the VM is gone within the deadline,
/// its instance terminated.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_on_a_one_token_bucket_is_still_deleted() -> anyhow::Result<()> {
    let env = Env::new("one-token").await?;
    let endpoint = env.moto.endpoint();
    let provider = provider(
        &env,
        "aws",
        &endpoint,
        Limits {
            requests_per_second: 1,
            burst: 1,
            creation_grace_period_seconds: GRACE_SECONDS,
            ..Limits::default()
        },
    )
    .await?;
    let operator = env.operator().start(operator_bin())?;
    let created = env.create_vm(env.vm("slow", &provider)).await?;
    let uid = created.uid().context("created VM without uid")?;
    let ready = env.wait_ready("slow").await?;
    let id = ready
        .status
        .and_then(|s| s.id)
        .context("Ready without id")?;

    let started = Instant::now();
    env.vms().delete("slow", &DeleteParams::default()).await?;
    let gone = env.wait_gone("slow").await;
    let calls = operator.calls_for("slow");
    gone.with_context(|| {
        let mut by_op = std::collections::BTreeMap::<&str, usize>::new();
        for call in &calls {
            *by_op.entry(call.op.as_str()).or_default() += 1;
        }
        format!(
            "not deleted after {:.0} s; its plugin calls by operation: {by_op:?}",
            started.elapsed().as_secs_f64()
        )
    })?;
    eprintln!(
        "one-token bucket: deleted in {:.1} s with {} plugin calls",
        started.elapsed().as_secs_f64(),
        calls.len()
    );
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "instance {id} is {state:?}"
    );
    ensure!(env.live_instances(&uid)?.is_empty(), "live instances left");
    Ok(())
}
