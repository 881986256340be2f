//! Contract 0.2 on real components: the output bounds of `wit/provider.wit` are enforced on
//! every export (an answer over a bound never reaches status, Events, logs or metrics), a
//! component built for 0.1 is refused naming both versions, and the new read-only exports
//! (`find`, `location`) answer through the sandbox.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::ensure;
use vmop::plugin::{
    CallContext, CallError, CallLimits, EgressPolicy, ErrorClass, Fault, LoadError, Phase,
    ProviderError, ProviderSettings, VmSpec,
};
use vmop_tests::fixtures::vm_spec;

use crate::support;

const UID: &str = "uid-1";

fn mode(m: &str) -> CallContext {
    CallContext {
        settings: ProviderSettings {
            settings: BTreeMap::from([("mode".to_owned(), m.to_owned())]),
            secrets: BTreeMap::new(),
            cluster: "vmop-tests".to_owned(),
        },
        egress: EgressPolicy::deny_all(),
        limits: CallLimits {
            timeout: Duration::from_secs(10),
            memory_bytes: 128 << 20,
            ..CallLimits::default()
        },
        label: "contract-test".to_owned(),
    }
}

/// The VM every call here is about (`find` looks for its uid).
fn spec() -> VmSpec {
    vm_spec(UID).build()
}

/// A violation: a plugin fault, transient (a fixed plugin is picked up on reload), reason
/// `PluginContractViolation`, and a message that does not carry the oversized content.
fn assert_violation<T: std::fmt::Debug>(
    result: Result<T, CallError>,
    what: &str,
) -> anyhow::Result<()> {
    let err = match result {
        Ok(v) => anyhow::bail!("{what}: accepted an answer over the bounds: {v:?}"),
        Err(e) => e,
    };
    ensure!(
        matches!(err, CallError::ContractViolation { .. }),
        "{what}: {err:?}"
    );
    ensure!(err.fault() == Fault::Plugin, "{what}: {:?}", err.fault());
    ensure!(err.class() == ErrorClass::Transient, "{what}");
    ensure!(err.reason() == "PluginContractViolation", "{what}");
    let text = vmop::telemetry::events::chain(&err);
    ensure!(
        text.len() < 300,
        "{what}: the error quotes the content ({} bytes)",
        text.len()
    );
    Ok(())
}

#[tokio::test]
async fn oversized_outputs_are_contract_violations() -> anyhow::Result<()> {
    let (_dir, hostile) = support::load("hostile").await?;
    for m in ["huge-id", "many-addresses", "huge-owner"] {
        let ctx = mode(m);
        assert_violation(hostile.create(&ctx, &spec()).await, &format!("{m} create"))?;
        assert_violation(hostile.get(&ctx, "i-1").await, &format!("{m} get"))?;
        assert_violation(hostile.find(&ctx, UID).await, &format!("{m} find"))?;
    }
    let ctx = mode("huge-message");
    assert_violation(hostile.create(&ctx, &spec()).await, "huge-message create")?;
    assert_violation(hostile.delete(&ctx, "i-1").await, "huge-message delete")?;
    let ctx = mode("retry-forever");
    assert_violation(hostile.get(&ctx, "i-1").await, "retry-forever get")?;
    assert_violation(
        hostile.location(&mode("huge-location")).await,
        "huge-location",
    )?;
    // The same plugin serves a well-behaved call right after.
    let ok = hostile.create(&mode("ok"), &spec()).await?;
    assert_eq!(ok.phase, Phase::Running);
    Ok(())
}

#[tokio::test]
async fn a_plugin_built_for_contract_0_1_is_refused_naming_both_versions() -> anyhow::Result<()> {
    let err = match support::load("old_wit").await {
        Ok(_) => anyhow::bail!("a 0.1 component must not load"),
        Err(e) => e,
    };
    let err = err
        .downcast::<LoadError>()
        .map_err(|e| e.context("refused, but not by the registry"))?;
    ensure!(
        matches!(&err, LoadError::IncompatibleWit { plugin, host, .. }
            if plugin == "0.1.0" && *host == vmop::plugin::WIT_VERSION),
        "refused for another reason: {err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("0.1.0") && text.contains(vmop::plugin::WIT_VERSION),
        "the message must name both versions: {text}"
    );
    Ok(())
}

#[tokio::test]
async fn find_and_location_answer_through_the_sandbox() -> anyhow::Result<()> {
    let (_dir, trivial) = support::load("trivial").await?;
    let ctx = mode("ok");
    let created = trivial.create(&ctx, &spec()).await?;
    let found = trivial.find(&ctx, UID).await?;
    assert_eq!(found.map(|f| f.id), Some(created.id));
    assert_eq!(trivial.location(&ctx).await?, "trivial");
    let info = trivial.info();
    assert_eq!(info.wit_version, vmop::plugin::WIT_VERSION);
    Ok(())
}

/// `list` answers are bounded like every other: a page over 1,000 machines or a cursor over
/// 4,096 bytes is a contract violation, and the host's listing refuses a cursor it was given
/// before (`endless`) rather than paging forever.
#[tokio::test]
async fn oversized_pages_are_contract_violations() -> anyhow::Result<()> {
    let (_dir, hostile) = support::load("hostile").await?;
    assert_violation(hostile.list(&mode("huge-page"), None).await, "huge-page")?;
    assert_violation(
        hostile.list(&mode("huge-cursor"), None).await,
        "huge-cursor",
    )?;
    let endless = hostile.list(&mode("endless"), Some("again")).await?;
    assert_eq!(endless.next.as_deref(), Some("again"), "the guest pages on");
    let (_dir, trivial) = support::load("trivial").await?;
    let page = trivial.list(&mode("ok"), None).await?;
    ensure!(page.machines.is_empty() && page.next.is_none(), "{page:?}");
    Ok(())
}

/// A plugin built against the frozen contract 0.2 loads and answers every export but `list`,
/// which the host refuses for it without calling into the guest.
#[tokio::test]
async fn a_plugin_built_for_contract_0_2_loads_and_cannot_list() -> anyhow::Result<()> {
    let (_dir, old) = support::load("vmop_fixture_testcloud_v02").await?;
    ensure!(
        old.contract() == vmop::plugin::Contract::V0_2,
        "{:?}",
        old.contract()
    );
    ensure!(
        old.info().wit_version.starts_with("0.2."),
        "{:?}",
        old.info()
    );
    ensure!(
        !old.info().has("list"),
        "a 0.2 plugin declares list: {:?}",
        old.info()
    );
    let refused = old.list(&mode("ok"), None).await;
    ensure!(
        matches!(&refused, Err(CallError::Provider(ProviderError::Permanent(m))) if m.contains("0.2")),
        "{refused:?}"
    );
    Ok(())
}
