//! A hostile guest (`tests/fixtures/guests/exfiltrate`) trying to get at the credentials, in the
//! production sandbox, with the call context the operator builds (`apply_credentials`):
//!
//! | attempt | what it gets |
//! |---|---|
//! | read `config.secrets` under signing | nothing: `secrets=0 []` |
//! | POST its whole config to an allowed loopback recorder | the recorder sees no Secret value in what the guest sent; only the host's signature, which carries the (non-secret) key id |
//! | send its own `Authorization` / `X-Amz-*` | removed: the recorder sees only the host's |
//! | the same under `passthrough` | the secrets, by the administrator's choice (the control case) |

use anyhow::ensure;
use vmop::api::CredentialsMode;

use crate::support::recorder::Recorder;
use crate::support::{attempt, context, load};

const KEY_ID: &str = "AKIDEXFILTRATETEST01";
const SECRET_KEY: &str = "wJalrXUtnFEMI-exfiltrate-secret-key";
const SESSION_TOKEN: &str = "session-token-exfiltrate-0123456789";

fn aws_secret() -> [(&'static str, &'static str); 3] {
    [
        ("access_key_id", KEY_ID),
        ("secret_access_key", SECRET_KEY),
        ("session_token", SESSION_TOKEN),
    ]
}

#[tokio::test]
async fn under_signing_the_plugin_reads_no_secret() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let settings = [("mode", "secrets"), ("region", "us-east-1")];
    let signed = context(&settings, &[], CredentialsMode::AwsSigV4, &aws_secret())?;
    assert_eq!(attempt(&plugin, &signed).await, "secrets=0 []");
    let bearer = context(
        &settings,
        &[],
        CredentialsMode::Bearer,
        &[("token", "bearer-token-exfiltrate")],
    )?;
    assert_eq!(attempt(&plugin, &bearer).await, "secrets=0 []");

    // The control: passthrough hands them over, and the operator says so (status, Event).
    let passthrough = context(&settings, &[], CredentialsMode::Passthrough, &aws_secret())?;
    let got = attempt(&plugin, &passthrough).await;
    ensure!(got.starts_with("secrets=3"), "{got}");
    Ok(())
}

#[tokio::test]
async fn whole_config_sent_to_an_allowed_host_carries_no_secret() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let recorder = Recorder::start().await?;
    let target = recorder.url("/collect");
    let ctx = context(
        &[
            ("mode", "send-config"),
            ("target", &target),
            ("region", "us-east-1"),
        ],
        &[recorder.origin()],
        CredentialsMode::AwsSigV4,
        &aws_secret(),
    )?;
    assert_eq!(attempt(&plugin, &ctx).await, "status 200");
    let requests = recorder.requests();
    ensure!(requests.len() == 1, "{requests:?}");
    let seen = &requests[0];
    ensure!(seen.body.contains("settings=[mode=send-config"), "{seen:?}");
    ensure!(seen.body.contains("secrets=[]"), "{seen:?}");
    for value in [KEY_ID, SECRET_KEY, SESSION_TOKEN] {
        ensure!(
            !seen.body.contains(value),
            "the guest sent {value:?}: {seen:?}"
        );
    }
    // The wire carries the host's signature: key id and session token by SigV4's design, the
    // secret key never.
    ensure!(!seen.head.contains(SECRET_KEY), "{seen:?}");
    let authorization = seen.headers("authorization");
    ensure!(
        authorization.len() == 1
            && authorization[0].starts_with(&format!("AWS4-HMAC-SHA256 Credential={KEY_ID}/")),
        "{authorization:?}"
    );
    Ok(())
}

#[tokio::test]
async fn guest_authorization_is_replaced_by_the_hosts() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let recorder = Recorder::start().await?;
    let target = recorder.url("/");
    let settings = [
        ("mode", "forge-auth"),
        ("target", target.as_str()),
        ("region", "us-east-1"),
        ("credentialsHeader", "X-Api-Key"),
    ];
    let allowed = [recorder.origin()];

    let sigv4 = context(
        &settings,
        &allowed,
        CredentialsMode::AwsSigV4,
        &aws_secret(),
    )?;
    assert_eq!(attempt(&plugin, &sigv4).await, "status 200");
    let bearer = context(
        &settings,
        &allowed,
        CredentialsMode::Bearer,
        &[("token", "host-bearer-token")],
    )?;
    assert_eq!(attempt(&plugin, &bearer).await, "status 200");
    let header = context(
        &settings,
        &allowed,
        CredentialsMode::Header,
        &[("token", "host-api-key")],
    )?;
    assert_eq!(attempt(&plugin, &header).await, "status 200");

    let requests = recorder.requests();
    ensure!(requests.len() == 3, "{requests:?}");
    // SigV4: one Authorization, the host's; x-amz-date and the token are the host's too.
    let signed = &requests[0];
    let auth = signed.headers("authorization");
    ensure!(
        auth.len() == 1 && auth[0].starts_with("AWS4-HMAC-SHA256"),
        "{signed:?}"
    );
    ensure!(
        signed.headers("x-amz-date") != ["20000101T000000Z"],
        "{signed:?}"
    );
    ensure!(
        signed.headers("x-amz-security-token") == [SESSION_TOKEN],
        "{signed:?}"
    );
    // Bearer: the guest's `Bearer guest-forged` is gone.
    ensure!(
        requests[1].headers("authorization") == ["Bearer host-bearer-token"],
        "{:?}",
        requests[1]
    );
    // Header mode owns only its header: the guest's x-api-key is replaced.
    ensure!(
        requests[2].headers("x-api-key") == ["host-api-key"],
        "{:?}",
        requests[2]
    );
    Ok(())
}

/// Under `passthrough` the plugin holds the secret and can put it in an error: the sandbox
/// redacts every error before it returns it, so the caller never sees the value.
const ECHOED: &str = "tok-ECHOED-IN-AN-ERROR-42";

#[tokio::test(flavor = "current_thread")]
async fn the_redactor_removes_an_echoed_secret_from_the_error() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let ctx = context(
        &[("mode", "echo"), ("as-error", "true")],
        &[],
        CredentialsMode::Passthrough,
        &[("token", ECHOED)],
    )?;
    let error = plugin.get(&ctx, "vm-1").await.map(drop);
    let text = format!("{error:?}");
    ensure!(
        text.contains("[redacted]") && !text.contains(ECHOED),
        "{text}"
    );
    Ok(())
}
