//! Egress is checked on the address a request goes to, with the real sandbox and the
//! `exfiltrate` guest. Names are mapped to 127.0.0.1 or 169.254.169.254 through the resolver
//! seam (`StaticResolver`), inside this process only.

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::ensure;
use vmop::api::CredentialsMode;
use vmop::plugin::{CallContext, EgressPolicy, StaticResolver};

use crate::support::recorder::Recorder;
use crate::support::{attempt, context, load};

fn ip(s: &str) -> anyhow::Result<IpAddr> {
    Ok(s.parse()?)
}

/// A context whose allowlist is `allowed` and whose names resolve through `resolver`.
fn fetch(target: &str, allowed: &[String], private: bool) -> anyhow::Result<CallContext> {
    let mut ctx = context(
        &[("mode", "fetch"), ("target", target), ("follow", "true")],
        allowed,
        CredentialsMode::Passthrough,
        &[],
    )?;
    let resolver = StaticResolver::new()
        .with("loopback.test", [ip("127.0.0.1")?])
        .with("metadata.test", [ip("169.254.169.254")?])
        .with("mapped.test", [ip("::ffff:127.0.0.1")?])
        .with("mapped-metadata.test", [ip("::ffff:169.254.169.254")?]);
    ctx.egress = EgressPolicy::parse(allowed)?
        .allow_private_networks(private)
        .with_resolver(Arc::new(resolver));
    Ok(ctx)
}

fn denied(got: &str) -> bool {
    got.starts_with("error:") && got.contains("HttpRequestDenied")
}

#[tokio::test]
async fn allowed_name_resolving_to_loopback_or_metadata_is_refused() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let recorder = Recorder::start().await?;
    let port = recorder.port;
    for name in [
        "loopback.test",
        "metadata.test",
        "mapped.test",
        "mapped-metadata.test",
    ] {
        let target = format!("http://{name}:{port}/");
        let ctx = fetch(&target, &[format!("http://*.test:{port}")], false)?;
        let got = attempt(&plugin, &ctx).await;
        ensure!(denied(&got), "{name}: {got}");
    }
    ensure!(recorder.requests().is_empty(), "a refused request arrived");

    // The control: the same name with allowPrivateNetworks reaches the recorder, so the seam
    // is what answered 127.0.0.1.
    let ctx = fetch(
        &format!("http://loopback.test:{port}/"),
        &[format!("http://*.test:{port}")],
        true,
    )?;
    assert_eq!(attempt(&plugin, &ctx).await, "status 200 (2 bytes)");
    assert_eq!(recorder.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn ipv4_mapped_decimal_and_octal_spellings_do_not_bypass() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let recorder = Recorder::start().await?;
    let port = recorder.port;
    // 127.0.0.1 is allowed literally; other spellings of it are not that entry, and are never
    // handed to a resolver (which would read them as 127.0.0.1), even with private networks on.
    let allowed = [recorder.origin()];
    for host in [
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[::ffff:169.254.169.254]",
        "[::169.254.169.254]",
    ] {
        for private in [false, true] {
            let ctx = fetch(&format!("http://{host}:{port}/"), &allowed, private)?;
            let got = attempt(&plugin, &ctx).await;
            ensure!(denied(&got), "{host} (private networks {private}): {got}");
        }
    }
    ensure!(recorder.requests().is_empty(), "{:?}", recorder.requests());
    // Such spellings cannot even be allowlisted.
    ensure!(EgressPolicy::parse([format!("http://2130706433:{port}")]).is_err());
    ensure!(EgressPolicy::parse([format!("http://0177.0.0.1:{port}")]).is_err());
    // The literal itself works.
    let ctx = fetch(&recorder.url("/"), &allowed, false)?;
    assert_eq!(attempt(&plugin, &ctx).await, "status 200 (2 bytes)");
    Ok(())
}

#[tokio::test]
async fn redirects_to_other_hosts_are_not_followed() -> anyhow::Result<()> {
    let (_dir, plugin) = load("exfiltrate").await?;
    let elsewhere = Recorder::start().await?;
    let redirect = Recorder::redirecting(&elsewhere.url("/stolen")).await?;
    let allowed = [redirect.origin()];

    // The host hands the 302 back; it does not follow it.
    let mut ctx = fetch(&redirect.url("/"), &allowed, false)?;
    ctx.settings
        .settings
        .insert("follow".into(), "false".into());
    assert_eq!(attempt(&plugin, &ctx).await, "status 302 (0 bytes)");
    ensure!(elsewhere.requests().is_empty());

    // A guest that follows it itself makes a new request, which the allowlist refuses.
    let ctx = fetch(&redirect.url("/"), &allowed, false)?;
    let got = attempt(&plugin, &ctx).await;
    ensure!(denied(&got), "{got}");
    ensure!(
        elsewhere.requests().is_empty(),
        "{:?}",
        elsewhere.requests()
    );
    assert_eq!(redirect.requests().len(), 2);
    Ok(())
}
