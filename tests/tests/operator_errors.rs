//! Errors: refused credentials surface as `Synced=False/Unauthorized` without retries until the
//! Secret changes; an invalid spec never reaches the operator (schema and CEL rules).

use std::path::Path;

use anyhow::{Context as _, bail, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use vmop_tests::moto::AwsCredentials;
use vmop_tests::operator::Env;

fn operator_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vmop-operator"))
}

#[tokio::test]
async fn refused_credentials_wait_for_a_secret_fix_without_retrying() -> anyhow::Result<()> {
    let env = Env::with_auth("unauthorized").await?;
    let good = env
        .credentials
        .clone()
        .context("moto without credentials")?;
    let wrong = AwsCredentials {
        access_key_id: good.access_key_id.clone(),
        secret_access_key: "wrong-secret".to_owned(),
    };
    env.create_secret("creds-wrong", &wrong).await?;
    let locked = env.provider_config("locked", "creds-wrong");
    env.apply_provider_config(&locked).await?;
    let control = env.standard_provider("control").await?;
    let operator = env
        .operator()
        .args_from(["--resync-period", "1s"])
        .start(operator_bin())?;

    env.create_vm(&env.vm("locked", &locked.metadata.name.clone().unwrap_or_default()))
        .await?;
    let failed = env
        .wait_vm_condition("locked", "Synced", "False", Some("Unauthorized"))
        .await?;
    let status = failed.status.unwrap_or_default();
    ensure!(
        status.last_error.as_deref() == Some("Unauthorized"),
        "{status:?}"
    );
    ensure!(
        status.id.is_none(),
        "an id despite refused credentials: {status:?}"
    );
    let events = env.vm_events("locked").await?;
    ensure!(
        events.iter().any(|(reason, _)| reason == "Unauthorized"),
        "events: {events:?}"
    );

    // While a healthy VM goes through several periodic checks, the refused one is not retried.
    env.create_vm(&env.vm("control", &control)).await?;
    env.wait_ready("control").await?;
    operator
        .wait_calls("three periodic checks of the control VM", |calls| {
            calls
                .iter()
                .filter(|c| c.vm.ends_with("/control") && c.op == "get")
                .count()
                >= 3
        })
        .await?;
    let locked_calls = operator.calls_for("locked");
    ensure!(
        locked_calls.len() == 1 && locked_calls.iter().all(|c| c.outcome == "Unauthorized"),
        "the refused VM was retried: {locked_calls:#?}"
    );

    // Fixing the Secret re-enqueues the VM.
    env.secrets()
        .patch(
            "creds-wrong",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": { "secret_access_key": good.secret_access_key } })),
        )
        .await?;
    let ready = env.wait_ready("locked").await?;
    let status = ready.status.unwrap_or_default();
    ensure!(
        status.last_error.is_none(),
        "lastError kept after recovery: {status:?}"
    );
    ensure!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Synced" && c.status == "True"),
        "not Synced after recovery: {:?}",
        status.conditions
    );
    Ok(())
}

/// The message of a 422 the API server answered, or a failure if it accepted the request.
fn rejection<T: std::fmt::Debug>(result: kube::Result<T>) -> anyhow::Result<String> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(status.message),
        other => bail!("the API server did not reject it: {other:?}"),
    }
}

#[tokio::test]
async fn invalid_specs_are_rejected_by_the_api_server_with_clear_messages() -> anyhow::Result<()> {
    let env = Env::new("invalid").await?;
    let post = PostParams::default();

    let mut vm = env.vm("no-cpu", "aws");
    vm.spec.cpu = 0;
    let message = rejection(env.vms().create(&post, &vm).await)?;
    ensure!(message.contains("spec.cpu"), "{message}");

    for memory in ["4GB", "-1Gi", "512Ki"] {
        let mut vm = env.vm("bad-memory", "aws");
        vm.spec.memory.0 = memory.to_owned();
        let message = rejection(env.vms().create(&post, &vm).await)?;
        ensure!(
            message.contains("memory must be a Kubernetes quantity of at least 1Mi"),
            "{memory}: {message}"
        );
    }

    env.create_vm(&env.vm("fixed", "aws")).await?;
    for (field, value, expected) in [
        ("image", json!("ami-other"), "image is immutable"),
        ("cpu", json!(4), "cpu is immutable"),
        ("memory", json!("8Gi"), "memory is immutable"),
        (
            "providerConfigRef",
            json!({ "name": "other" }),
            "providerConfigRef is immutable",
        ),
        ("userData", json!("#cloud-config"), "userData is immutable"),
    ] {
        let patch = Patch::Merge(json!({ "spec": { field: value } }));
        let message = rejection(
            env.vms()
                .patch("fixed", &PatchParams::default(), &patch)
                .await,
        )?;
        ensure!(message.contains(expected), "{field}: {message}");
    }
    // What the provider does not depend on stays mutable.
    let patch = Patch::Merge(json!({ "spec": { "deletionPolicy": "Orphan" } }));
    env.vms()
        .patch("fixed", &PatchParams::default(), &patch)
        .await?;
    Ok(())
}
