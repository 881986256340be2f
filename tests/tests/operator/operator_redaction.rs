//! Redaction end to end: a plugin that echoes the Secret's value in a log line, on
//! stdout and stderr, in a status message and in an error (the `exfiltrate` guest, mode `echo`,
//! under `credentials: passthrough`, the only mode that hands it the value) leaves it nowhere
//! the operator publishes: its log, the Events, the VMs' status, `/metrics`.

use std::collections::BTreeMap;

use anyhow::ensure;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use vmop::api::CredentialsMode;
use vmop_tests::operator::{Env, scrape::scrape};

use crate::operator_bin;

const SECRET: &str = "s3cr3t-value-the-plugin-must-not-leak";

#[tokio::test]
async fn an_echoed_secret_appears_nowhere_the_operator_publishes() -> anyhow::Result<()> {
    let env = Env::new("redaction").await?;
    std::fs::copy(
        vmop_tests::wasm::path("exfiltrate")?,
        env.plugin_dir.path().join("exfiltrate.wasm"),
    )?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("echo".to_owned()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("token".to_owned(), SECRET.to_owned())])),
        ..Secret::default()
    };
    env.secrets()
        .create(&PostParams::default(), &secret)
        .await?;
    let mut names = Vec::new();
    for (suffix, as_error) in [("status", false), ("error", true)] {
        let mut pc = env.provider_config(suffix, "echo");
        pc.spec.plugin.path = "exfiltrate.wasm".to_owned();
        pc.spec.config = BTreeMap::from([("mode".to_owned(), "echo".to_owned())]);
        if as_error {
            pc.spec
                .config
                .insert("as-error".to_owned(), "true".to_owned());
        }
        pc.spec.credentials = CredentialsMode::Passthrough;
        pc.spec.allowed_hosts = Vec::new();
        env.apply_provider_config(&pc).await?;
        names.push(pc.name_any());
    }
    let operator = env.operator().start(operator_bin())?;
    let (status_pc, error_pc) = (&names[0], &names[1]);
    env.create_vm(env.vm("echo-status", status_pc)).await?;
    env.create_vm(env.vm("echo-error", error_pc)).await?;
    env.wait_ready("echo-status").await?;
    env.wait_vm("echo-error", "a failure recorded in Synced", |vm| {
        vm.and_then(|v| v.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Synced" && c.status == "False")
        })
    })
    .await?;

    let vms = serde_json::to_string(&env.vms().list(&Default::default()).await?.items)?;
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.namespace);
    let events = serde_json::to_string(&events.list(&Default::default()).await?.items)?;
    let metrics = scrape(operator.metrics_addr().await?).await?.text;
    let log = operator.log();
    ensure!(
        vms.contains("[redacted]"),
        "the echo did not reach the status at all (the test proves nothing): {vms}"
    );
    for (place, text) in [
        ("VM status", &vms),
        ("Events", &events),
        ("/metrics", &metrics),
        ("operator log", &log),
    ] {
        ensure!(!text.contains(SECRET), "the secret reached the {place}");
    }
    Ok(())
}
