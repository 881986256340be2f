//! Deletion without a way to reach the cloud: a missing ProviderConfig keeps the finalizer and
//! says why, so the machine is never silently orphaned; once it is back, deletion completes.

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use kube::api::DeleteParams;
use vmop::api::VM_FINALIZER;
use vmop_tests::operator::Env;

use crate::operator_bin;

#[tokio::test]
async fn missing_provider_config_keeps_the_finalizer_until_it_returns() -> anyhow::Result<()> {
    let env = Env::new("blocked").await?;
    let provider = env.standard_provider("aws").await?;
    let _operator = env.operator().start(operator_bin())?;
    env.create_vm(env.vm("stuck", &provider)).await?;
    let id = env
        .wait_ready("stuck")
        .await?
        .status
        .and_then(|s| s.id)
        .context("no id")?;
    let pc = env.provider_configs().get(&provider).await?;

    env.provider_configs()
        .delete(&provider, &DeleteParams::default())
        .await?;
    env.vms().delete("stuck", &DeleteParams::default()).await?;
    let blocked = env
        .wait_vm("stuck", "blocked on the missing ProviderConfig", |vm| {
            vm.is_some_and(|vm| {
                vm.metadata.deletion_timestamp.is_some()
                    && vm.status.as_ref().is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == "Synced"
                                && c.status == "False"
                                && c.reason == "ProviderConfigNotFound"
                                && c.message.starts_with("cannot delete the external machine")
                        })
                    })
            })
        })
        .await?
        .context("the VM was deleted without its ProviderConfig")?;
    ensure!(
        blocked.finalizers().iter().any(|f| f == VM_FINALIZER),
        "finalizer dropped: {:?}",
        blocked.finalizers()
    );
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("running"),
        "instance {id} is {state:?}"
    );
    env.wait_vm_event("stuck", "ProviderConfigNotFound").await?;

    let mut back = pc.clone();
    back.metadata = kube::api::ObjectMeta {
        name: pc.metadata.name.clone(),
        labels: pc.metadata.labels.clone(),
        ..Default::default()
    };
    back.status = None;
    env.apply_provider_config(&back).await?;
    env.wait_gone("stuck").await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "instance {id} is {state:?}"
    );
    Ok(())
}

/// A VM whose creates all failed without reaching the cloud (the endpoint
/// refuses connections) is deleted while the endpoint stays down: the sandbox proves no
/// request left the host, so no machine can exist and no cloud call is needed. Before, the
/// deletion looked the machine up by calling `create` and stayed stuck until the endpoint came
/// back.
#[tokio::test]
async fn a_vm_whose_creates_never_reached_the_cloud_is_deleted_while_the_endpoint_is_down()
-> anyhow::Result<()> {
    let env = Env::new("unreached").await?;
    let proxy = vmop_tests::faults::FaultProxy::to_port(env.moto.port())?;
    let mut pc = env.provider_config("aws", "creds-aws");
    pc.spec.config.insert("endpoint".into(), proxy.endpoint());
    pc.spec.allowed_hosts = vec![proxy.endpoint()];
    env.standard_provider("aws").await?;
    env.apply_provider_config(&pc).await?;
    let provider = pc.name_any();
    let operator = env.operator().start(operator_bin())?;
    // One VM made while the endpoint works: the ProviderConfig's location is known.
    env.create_vm(env.vm("early", &provider)).await?;
    env.wait_ready("early").await?;

    drop(proxy);
    env.create_vm(env.vm("doomed", &provider)).await?;
    operator
        .wait_calls("a failed create of doomed", |calls| {
            calls
                .iter()
                .any(|c| c.vm.ends_with("/doomed") && c.op == "create" && c.outcome != "ok")
        })
        .await?;
    let before = operator.calls_for("doomed").len();
    env.vms().delete("doomed", &DeleteParams::default()).await?;
    env.wait_gone("doomed").await?;
    let during: Vec<String> = operator
        .calls_for("doomed")
        .iter()
        .skip(before)
        .map(|c| c.op.clone())
        .collect();
    ensure!(
        !during.iter().any(|op| op == "create"),
        "deletion called create: {during:?}"
    );
    Ok(())
}
