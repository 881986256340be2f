//! A plugin that echoes a Secret value (`passthrough`, so it holds one) in a log line, on
//! stdout and stderr, in a status message and in an error: the value reaches no log line of
//! the host, and the redactor callers apply removes it from the status and the error.
//!
//! The operator-level half (Events, status, /metrics of a running operator) needs the
//! redaction applied where call results leave the plugin runtime; see the module docs of
//! `vmop::plugin::redact`.

use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::ensure;
use vmop::api::CredentialsMode;

use crate::support::{context, load};

const SECRET: &str = "tok-REDACT-ME-0123456789";

/// Everything the host logs, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

/// The host's log of this whole test binary, captured by one global subscriber (a thread-local
/// one misses lines when tests run in parallel). Every test here must keep secrets out of it.
fn capture() -> Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .json()
                .with_writer(move || writer.clone())
                .finish();
            // Fails only if another subscriber was installed first, and none is here.
            let _ = tracing::subscriber::set_global_default(subscriber);
            captured
        })
        .clone()
}

fn echo_context(as_error: bool) -> anyhow::Result<vmop::plugin::CallContext> {
    let mut settings = vec![("mode", "echo")];
    if as_error {
        settings.push(("as-error", "true"));
    }
    context(
        &settings,
        &[],
        CredentialsMode::Passthrough,
        &[("token", SECRET)],
    )
}

#[tokio::test(flavor = "current_thread")]
async fn echoed_secrets_reach_no_log_line_and_no_status() -> anyhow::Result<()> {
    let captured = capture();
    let (_dir, plugin) = load("exfiltrate").await?;
    let ctx = echo_context(false)?;
    let redactor = ctx.egress.redactor().clone();

    let status = plugin.get(&ctx, "vm-1").await?.map(|s| redactor.status(s));
    let message = status.and_then(|s| s.message).unwrap_or_default();
    assert_eq!(message, "the secrets are: [redacted]");

    let log = captured.text();
    for needle in [
        "the secrets are: [redacted]",
        "\"stream\":\"stdout\"",
        "\"stream\":\"stderr\"",
    ] {
        ensure!(log.contains(needle), "missing {needle:?} in\n{log}");
    }
    ensure!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    Ok(())
}

/// The error path: a provider error echoing a secret reaches no log line (`sandbox::call`
/// redacts the error before logging or returning it).
#[tokio::test(flavor = "current_thread")]
async fn echoed_secret_in_an_error_reaches_no_log_line() -> anyhow::Result<()> {
    let captured = capture();
    let (_dir, plugin) = load("exfiltrate").await?;
    let ctx = echo_context(true)?;
    let error = plugin.get(&ctx, "vm-1").await.map(drop);
    let text = format!("{error:?}");
    ensure!(
        text.contains("[redacted]") && !text.contains(SECRET),
        "{text}"
    );
    let log = captured.text();
    ensure!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    Ok(())
}
