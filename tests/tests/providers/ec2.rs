//! The EC2 provider plugin (`providers/ec2`, built to wasm32-wasip2 by `tests/build.rs`) against
//! a real EC2 API (moto's server on loopback), called through the production sandbox: the
//! plugin registry, a fresh Store per call, the egress allowlist and the call limits.
//!
//! Needs `moto_server` (`pip install 'moto[server]'`; `$VMOP_MOTO_SERVER` or `PATH`).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use vmop::plugin::{
    CallContext, CallError, CallLimits, EgressPolicy, EngineConfig, ErrorClass, Phase, Plugin,
    PluginEngine, PluginRegistry, ProviderError, ProviderSettings, RegistryConfig, VmSpec,
};
use vmop_tests::fixtures::vm_spec;
use vmop_tests::moto::{AwsCredentials, Moto};

const EC2_GUEST: &str = "vmop_provider_ec2";
/// An AMI moto serves by default.
const IMAGE: &str = "ami-12c6146b";
const UID_TAG: &str = "vmop.dev/uid";

/// The EC2 plugin loaded through a registry over a private plugin directory.
struct Harness {
    plugin: Arc<Plugin>,
    _plugin_dir: tempfile::TempDir,
}

impl Harness {
    async fn load() -> Result<Self> {
        let wasm = vmop_tests::wasm::path(EC2_GUEST)?;
        let plugin_dir = tempfile::tempdir()?;
        let file = format!("{EC2_GUEST}.wasm");
        std::fs::copy(wasm, plugin_dir.path().join(&file))
            .with_context(|| format!("copying {}", wasm.display()))?;
        let engine = PluginEngine::new(&EngineConfig::default())?;
        let registry = PluginRegistry::new(
            engine,
            RegistryConfig {
                plugin_dir: plugin_dir.path().to_path_buf(),
                cache_dir: None,
                info_limits: CallLimits::default(),
            },
        )?;
        let plugin = registry.load(&file, None).await?;
        ensure!(
            plugin.info().name == "ec2",
            "unexpected plugin info {:?}",
            plugin.info()
        );
        Ok(Harness {
            plugin,
            _plugin_dir: plugin_dir,
        })
    }
}

/// A call context for `moto`'s endpoint, allowed (and only it) by the egress policy.
fn context(moto: &Moto, credentials: &AwsCredentials) -> Result<CallContext> {
    Ok(CallContext {
        settings: ProviderSettings {
            settings: BTreeMap::from([
                ("region".to_owned(), "us-east-1".to_owned()),
                ("endpoint".to_owned(), moto.endpoint()),
            ]),
            secrets: BTreeMap::from([
                (
                    "access_key_id".to_owned(),
                    credentials.access_key_id.clone(),
                ),
                (
                    "secret_access_key".to_owned(),
                    credentials.secret_access_key.clone(),
                ),
            ]),
            cluster: "ec2-test".to_owned(),
        },
        egress: EgressPolicy::parse([moto.endpoint()])?,
        limits: CallLimits::default(),
        label: "ec2-test".to_owned(),
    })
}

/// Moto without authentication accepts any key.
fn any_credentials() -> AwsCredentials {
    AwsCredentials {
        access_key_id: "AKIAIOSFODNN7EXAMPLE".to_owned(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".to_owned(),
    }
}

/// A VM with everything the plugin maps to EC2: instance type, user data, tags.
fn spec(uid: &str, image: &str) -> VmSpec {
    vm_spec(uid)
        .named("team-a", "web-1")
        .image(image)
        .cpu(2)
        .memory_mib(4096)
        .user_data("#cloud-config\n")
        .label("app", "web")
        .build()
}

fn provider_error(result: Result<impl std::fmt::Debug, CallError>) -> Result<ProviderError> {
    match result {
        Err(CallError::Provider(e)) => Ok(e),
        other => anyhow::bail!("expected a provider error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn create_then_get_shows_the_running_instance() -> Result<()> {
    let moto = Moto::start()?;
    let ec2 = Harness::load().await?;
    let ctx = context(&moto, &any_credentials())?;
    let uid = "3f0c4a52-0000-4000-8000-000000000001";

    let created = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    ensure!(
        created.id.starts_with("i-"),
        "not an instance id: {created:?}"
    );
    let observed = ec2
        .plugin
        .get(&ctx, &created.id)
        .await?
        .context("get found nothing")?;
    ensure!(observed.id == created.id, "{observed:?} vs {created:?}");
    ensure!(observed.phase == Phase::Running, "{observed:?}");
    ensure!(!observed.addresses.is_empty(), "no addresses: {observed:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn create_twice_with_the_same_uid_makes_one_instance() -> Result<()> {
    let moto = Moto::start()?;
    let ec2 = Harness::load().await?;
    let ctx = context(&moto, &any_credentials())?;
    let uid = "3f0c4a52-0000-4000-8000-000000000002";

    let first = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    let second = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    ensure!(
        first.id == second.id,
        "two instances: {first:?} and {second:?}"
    );
    let tagged = moto.instance_ids_with_tag(UID_TAG, uid)?;
    ensure!(
        tagged == [first.id.clone()],
        "moto has {tagged:?} for uid {uid}"
    );

    // Another VM is another instance.
    let other = ec2
        .plugin
        .create(&ctx, &spec("3f0c4a52-0000-4000-8000-0000000000ff", IMAGE))
        .await?;
    ensure!(other.id != first.id, "a different uid reused {}", first.id);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_terminates_and_is_idempotent() -> Result<()> {
    let moto = Moto::start()?;
    let ec2 = Harness::load().await?;
    let ctx = context(&moto, &any_credentials())?;
    let uid = "3f0c4a52-0000-4000-8000-000000000003";

    let created = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    ec2.plugin.delete(&ctx, &created.id).await?;
    let after = ec2.plugin.get(&ctx, &created.id).await?;
    ensure!(after.is_none(), "get after delete: {after:?}");
    let state = moto.instance_state(&created.id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "moto reports {state:?}"
    );

    ec2.plugin
        .delete(&ctx, &created.id)
        .await
        .context("second delete")?;
    ec2.plugin
        .delete(&ctx, "i-0123456789abcdef0")
        .await
        .context("delete of an unknown id")?;
    let unknown = ec2.plugin.get(&ctx, "i-0123456789abcdef0").await?;
    ensure!(unknown.is_none(), "get of an unknown id: {unknown:?}");

    // A new create for the same VM after its instance was terminated launches a new one.
    let recreated = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    ensure!(
        recreated.id != created.id,
        "create returned the terminated {}",
        created.id
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_image_is_an_invalid_spec() -> Result<()> {
    let moto = Moto::start()?;
    let ec2 = Harness::load().await?;
    let ctx = context(&moto, &any_credentials())?;
    let uid = "3f0c4a52-0000-4000-8000-000000000004";

    let result = ec2
        .plugin
        .create(&ctx, &spec(uid, "ami-00000000deadbeef"))
        .await;
    let error = provider_error(result)?;
    ensure!(
        matches!(error, ProviderError::InvalidSpec(ref m) if m.contains("InvalidAMIID")),
        "{error:?}"
    );
    ensure!(ErrorClass::from(&error) == ErrorClass::InvalidSpec);
    let tagged = moto.instance_ids_with_tag(UID_TAG, uid)?;
    ensure!(
        tagged.is_empty(),
        "an instance was launched anyway: {tagged:?}"
    );

    let result = ec2.plugin.create(&ctx, &spec(uid, "ubuntu-24.04")).await;
    let error = provider_error(result)?;
    ensure!(matches!(error, ProviderError::InvalidSpec(_)), "{error:?}");
    Ok(())
}

/// Moto in IAM-authentication mode verifies the plugin's SigV4 signatures: the issued key works,
/// a wrong secret or an unknown key is `unauthorized`.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_are_checked_and_wrong_ones_are_unauthorized() -> Result<()> {
    let (moto, credentials) = Moto::start_with_auth()?;
    let ec2 = Harness::load().await?;
    let uid = "3f0c4a52-0000-4000-8000-000000000005";

    let ctx = context(&moto, &credentials)?;
    let created = ec2
        .plugin
        .create(&ctx, &spec(uid, IMAGE))
        .await
        .context("with valid credentials")?;
    ensure!(
        ec2.plugin.get(&ctx, &created.id).await?.is_some(),
        "valid credentials see nothing"
    );

    let wrong_secret = AwsCredentials {
        secret_access_key: "not-the-secret".to_owned(),
        ..credentials.clone()
    };
    let unknown_key = AwsCredentials {
        access_key_id: "AKIAUNKNOWNKEY000000".to_owned(),
        ..credentials
    };
    for wrong in [wrong_secret, unknown_key] {
        let ctx = context(&moto, &wrong)?;
        let error = provider_error(ec2.plugin.get(&ctx, &created.id).await)?;
        ensure!(
            matches!(error, ProviderError::Unauthorized(_)),
            "{wrong:?}: {error:?}"
        );
        ensure!(ErrorClass::from(&error) == ErrorClass::Unauthorized);
        let error = provider_error(ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await)?;
        ensure!(
            matches!(error, ProviderError::Unauthorized(_)),
            "{wrong:?}: {error:?}"
        );
        ensure!(
            !format!("{error:?}").contains("not-the-secret"),
            "secret leaked: {error:?}"
        );
    }
    Ok(())
}

/// The endpoint is moto's, but the allowlist names another port: the sandbox refuses the
/// connection and the plugin reports a configuration (permanent) error.
#[tokio::test(flavor = "multi_thread")]
async fn endpoint_outside_the_allowlist_is_refused() -> Result<()> {
    let moto = Moto::start()?;
    let ec2 = Harness::load().await?;
    let mut ctx = context(&moto, &any_credentials())?;
    let other_port = if moto.port() == u16::MAX {
        moto.port() - 1
    } else {
        moto.port() + 1
    };
    ctx.egress = EgressPolicy::parse([format!("http://127.0.0.1:{other_port}")])?;

    let error = provider_error(ec2.plugin.get(&ctx, "i-0123456789abcdef0").await)?;
    ensure!(
        matches!(error, ProviderError::Permanent(ref m) if m.contains("allowedHosts")),
        "{error:?}"
    );
    Ok(())
}

/// A machine stopped or terminated outside vmop is observed as such: `Stopped`, then gone.
#[tokio::test(flavor = "multi_thread")]
async fn changes_made_outside_vmop_are_observed() -> Result<()> {
    let moto = Moto::start()?;
    let ec2 = Harness::load().await?;
    let ctx = context(&moto, &any_credentials())?;
    let uid = "3f0c4a52-0000-4000-8000-000000000006";

    let created = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    moto.ec2("StopInstances", &[("InstanceId.1", created.id.as_str())])?;
    let stopped = ec2
        .plugin
        .get(&ctx, &created.id)
        .await?
        .context("stopped instance not found")?;
    ensure!(stopped.phase == Phase::Stopped, "{stopped:?}");
    // A stopped instance still stands for its VM: create must not launch another.
    let again = ec2.plugin.create(&ctx, &spec(uid, IMAGE)).await?;
    ensure!(again.id == created.id, "{again:?} vs {created:?}");

    moto.ec2(
        "TerminateInstances",
        &[("InstanceId.1", created.id.as_str())],
    )?;
    let gone = ec2.plugin.get(&ctx, &created.id).await?;
    ensure!(
        gone.is_none(),
        "terminated instance still reported: {gone:?}"
    );
    Ok(())
}
