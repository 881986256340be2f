//! Errors: refused credentials surface as `Synced=False/Unauthorized` without retries until the
//! Secret changes; an invalid spec never reaches the operator (schema and CEL rules).

use anyhow::{Context as _, bail, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use vmop_tests::moto::AwsCredentials;
use vmop_tests::operator::Env;

use crate::operator_bin;

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

    env.create_vm(env.vm("locked", &locked.metadata.name.clone().unwrap_or_default()))
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
    env.wait_vm_event("locked", "Unauthorized").await?;

    // While a healthy VM goes through several periodic checks (the ec2 plugin can `list`: each
    // listing of its ProviderConfig is the drift check of its VMs), the refused one is not
    // retried.
    env.create_vm(env.vm("control", &control)).await?;
    env.wait_ready("control").await?;
    let listings = format!("providerconfig/{control}");
    let before = operator
        .provider_calls()
        .iter()
        .filter(|c| c.vm == listings && c.op == "list")
        .count();
    operator
        .wait_calls("three periodic checks of the control VM", |calls| {
            calls
                .iter()
                .filter(|c| c.vm == listings && c.op == "list")
                .count()
                >= before + 3
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

    let vm = env.vm("no-cpu", "aws").cpu(0).build();
    let message = rejection(env.vms().create(&post, &vm).await)?;
    ensure!(message.contains("spec.cpu"), "{message}");

    for memory in ["4GB", "-1Gi", "512Ki"] {
        let vm = env.vm("bad-memory", "aws").memory(memory).build();
        let message = rejection(env.vms().create(&post, &vm).await)?;
        ensure!(
            message.contains("memory must be a Kubernetes quantity of at least 1Mi"),
            "{memory}: {message}"
        );
    }

    env.create_vm(env.vm("fixed", "aws")).await?;
    for (field, value, expected) in [
        ("image", json!("ami-other"), "image is immutable"),
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
    // What the provider does not depend on stays mutable, and cpu/memory are resized through
    // the provider's `update`.
    let patch =
        Patch::Merge(json!({ "spec": { "deletionPolicy": "Orphan", "cpu": 4, "memory": "8Gi" } }));
    env.vms()
        .patch("fixed", &PatchParams::default(), &patch)
        .await?;
    Ok(())
}

/// Gaps between consecutive calls, from their log timestamps.
fn gaps(calls: &[vmop_tests::operator::ProviderCall]) -> anyhow::Result<Vec<f64>> {
    let times = calls
        .iter()
        .map(|c| c.timestamp.parse::<k8s_openapi::jiff::Timestamp>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(times
        .windows(2)
        .filter_map(|w| Some(w.get(1)?.duration_since(*w.first()?).as_secs_f64()))
        .collect())
}

/// An endpoint nothing listens on.
fn closed_endpoint() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    drop(listener);
    Ok(format!("http://127.0.0.1:{port}"))
}

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

#[tokio::test]
async fn transient_failures_back_off_per_object_and_reset_on_success() -> anyhow::Result<()> {
    let env = Env::new("backoff").await?;
    let provider = env.standard_provider("aws").await?;
    let unreachable = closed_endpoint()?;
    point_at(&env, &provider, &unreachable).await?;
    let operator = env.operator().start(operator_bin())?;

    env.create_vm(env.vm("flaky", &provider)).await?;
    let failing = operator
        .wait_calls("four failed creates", |calls| {
            calls
                .iter()
                .filter(|c| c.vm.ends_with("/flaky") && c.outcome == "TransientError")
                .count()
                >= 4
        })
        .await?;
    let failed: Vec<_> = failing
        .into_iter()
        .filter(|c| c.vm.ends_with("/flaky"))
        .collect();
    let spacing = gaps(&failed)?;
    ensure!(
        spacing.windows(2).all(|w| w.get(1) > w.first()),
        "retries are not backing off: gaps {spacing:?}"
    );
    env.wait_vm_condition("flaky", "Synced", "False", Some("TransientError"))
        .await?;
    let longest = spacing.last().copied().unwrap_or_default();

    // Success resets the sequence: the next failure is retried after the base delay again.
    point_at(&env, &provider, &env.moto.endpoint()).await?;
    env.wait_ready("flaky").await?;
    let before = operator.calls_for("flaky").len();
    point_at(&env, &provider, &unreachable).await?;
    let calls = operator
        .wait_calls("two failed checks after the success", |calls| {
            calls
                .iter()
                .filter(|c| c.vm.ends_with("/flaky"))
                .skip(before)
                .filter(|c| c.outcome == "TransientError")
                .count()
                >= 2
        })
        .await?;
    let after: Vec<_> = calls
        .into_iter()
        .filter(|c| c.vm.ends_with("/flaky"))
        .skip(before)
        .filter(|c| c.outcome == "TransientError")
        .take(2)
        .collect();
    let first_gap = gaps(&after)?.first().copied().unwrap_or_default();
    ensure!(
        first_gap < longest,
        "the backoff was not reset: first gap after success {first_gap:.2}s, longest before {longest:.2}s"
    );
    Ok(())
}
