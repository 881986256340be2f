//! The ec2 plugin with host-side SigV4 against moto in IAM-authentication mode
//! (`INITIAL_NO_AUTH_ACTION_COUNT`): moto checks every signature and permission, so a
//! lifecycle that succeeds proves the host's signatures are real; a wrong secret key is refused
//! by moto, so the plugin cannot be succeeding unsigned.

use anyhow::ensure;
use vmop::api::CredentialsMode;
use vmop::plugin::{CallContext, CallError, ErrorClass, Phase};
use vmop_tests::fixtures::vm_spec;
use vmop_tests::moto::{AwsCredentials, Moto};

use crate::support::{context, load};

fn signed(moto: &Moto, credentials: &AwsCredentials) -> anyhow::Result<CallContext> {
    let endpoint = moto.endpoint();
    context(
        &[("region", "us-east-1"), ("endpoint", &endpoint)],
        std::slice::from_ref(&endpoint),
        CredentialsMode::AwsSigV4,
        &[
            ("access_key_id", &credentials.access_key_id),
            ("secret_access_key", &credentials.secret_access_key),
        ],
    )
}

#[tokio::test]
async fn lifecycle_with_host_signing_passes_motos_sigv4_checks() -> anyhow::Result<()> {
    let (moto, credentials) = Moto::start_with_auth()?;
    let (_dir, plugin) = load("vmop_provider_ec2").await?;
    let ctx = signed(&moto, &credentials)?;
    ensure!(
        ctx.settings.secrets.is_empty(),
        "the plugin must hold no key"
    );

    let created = plugin.create(&ctx, &vm_spec("signing-1").build()).await?;
    let seen = plugin.get(&ctx, &created.id).await?;
    ensure!(
        seen.as_ref().is_some_and(|s| s.phase == Phase::Running),
        "{seen:?}"
    );
    plugin.delete(&ctx, &created.id).await?;

    // moto really checks: the same calls with a wrong secret key are refused.
    let wrong = AwsCredentials {
        secret_access_key: "not-the-secret".into(),
        ..credentials
    };
    let result = plugin.get(&signed(&moto, &wrong)?, &created.id).await;
    ensure!(
        matches!(&result, Err(e @ CallError::Provider(_)) if e.class() == ErrorClass::Unauthorized),
        "{result:?}"
    );
    Ok(())
}
