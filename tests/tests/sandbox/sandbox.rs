//! The sandbox against real hostile guests (`tests/fixtures/guests/hostile`): every kind of
//! misbehaviour ends as a typed error for that call only, concurrent healthy calls are not
//! disturbed, and the same `Plugin` serves the next call normally.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vmop::plugin::{
    CallContext, CallError, CallLimits, EgressPolicy, EngineConfig, ErrorClass, Fault, Phase,
    Plugin, PluginEngine, PluginRegistry, ProviderError, ProviderSettings, RegistryConfig,
};
use vmop_tests::fixtures::vm_spec;

struct Fixture {
    _dir: tempfile::TempDir,
    hostile: Arc<Plugin>,
    trivial: Arc<Plugin>,
}

async fn fixture() -> anyhow::Result<Fixture> {
    fixture_with(16).await
}

async fn fixture_with(max_instances: u32) -> anyhow::Result<Fixture> {
    let dir = tempfile::tempdir()?;
    for name in ["hostile", "trivial"] {
        let wasm = vmop_tests::wasm::path(name)?;
        std::fs::copy(wasm, dir.path().join(format!("{name}.wasm")))?;
    }
    let engine = PluginEngine::new(&EngineConfig {
        max_instances,
        ..EngineConfig::default()
    })?;
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: dir.path().to_path_buf(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        },
    )?;
    Ok(Fixture {
        hostile: registry.load(Path::new("hostile.wasm"), None).await?,
        trivial: registry.load(Path::new("trivial.wasm"), None).await?,
        _dir: dir,
    })
}

fn ctx(settings: &[(&str, &str)], timeout: Duration) -> CallContext {
    CallContext {
        settings: ProviderSettings {
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secrets: BTreeMap::from([("token".to_string(), "s3cr3t".to_string())]),
            cluster: "vmop-tests".to_owned(),
        },
        egress: EgressPolicy::deny_all(),
        limits: CallLimits {
            timeout,
            memory_bytes: 64 << 20,
            ..CallLimits::default()
        },
        label: "sandbox-test".to_string(),
    }
}

fn mode(m: &str) -> CallContext {
    ctx(&[("mode", m)], Duration::from_secs(5))
}

/// The plugin still works after whatever happened before.
async fn assert_serves_next_call(plugin: &Plugin) -> anyhow::Result<()> {
    let status = plugin
        .create(&mode("ok"), &vm_spec("after").build())
        .await?;
    anyhow::ensure!(
        status.id == "vm-after" && status.phase == Phase::Running,
        "{status:?}"
    );
    Ok(())
}

fn stamped<T>(result: T) -> (T, Instant) {
    (result, Instant::now())
}

fn assert_plugin_fault(err: &CallError) {
    assert_eq!(err.fault(), Fault::Plugin, "{err:?}");
    assert_eq!(err.class(), ErrorClass::Transient, "{err:?}");
}

#[tokio::test]
async fn no_state_survives_a_call() -> anyhow::Result<()> {
    let f = fixture().await?;
    for round in 0..20 {
        // Interleave failures that leave an instance mid-flight.
        let _ = f
            .hostile
            .get(&mode(if round % 2 == 0 { "trap" } else { "grow" }), "x")
            .await;
        let status = f.hostile.get(&mode("count"), "vm-1").await?;
        let calls = status.and_then(|s| s.message);
        assert_eq!(
            calls.as_deref(),
            Some("1"),
            "round {round}: instance state leaked"
        );
    }
    Ok(())
}

#[tokio::test]
async fn an_infinite_loop_is_stopped_by_the_deadline() -> anyhow::Result<()> {
    let f = fixture().await?;
    let limit = Duration::from_millis(500);
    let err = f
        .hostile
        .get(&ctx(&[("mode", "loop")], limit), "vm-1")
        .await
        .err()
        .context("an infinite loop returned")?;
    assert!(
        matches!(err, CallError::Timeout { timeout, .. } if timeout == limit),
        "{err:?}"
    );
    assert_plugin_fault(&err);
    assert_serves_next_call(&f.hostile).await
}

#[tokio::test]
async fn a_guest_blocked_in_a_host_call_is_stopped_by_the_wall_clock_timeout() -> anyhow::Result<()>
{
    let f = fixture().await?;
    let err = f
        .hostile
        .get(
            &ctx(&[("mode", "sleep")], Duration::from_millis(300)),
            "vm-1",
        )
        .await
        .err()
        .context("an hour-long sleep returned")?;
    assert!(matches!(err, CallError::Timeout { .. }), "{err:?}");
    assert_plugin_fault(&err);
    assert_serves_next_call(&f.hostile).await
}

#[tokio::test]
async fn growing_memory_past_the_cap_fails_cleanly() -> anyhow::Result<()> {
    let f = fixture().await?;
    let err = f
        .hostile
        .get(&mode("grow"), "vm-1")
        .await
        .err()
        .context("unbounded allocation returned")?;
    assert!(
        matches!(err, CallError::MemoryLimit { cap, .. } if cap == 64 << 20),
        "{err:?}"
    );
    assert_plugin_fault(&err);
    assert_serves_next_call(&f.hostile).await
}

#[tokio::test]
async fn a_trapping_guest_is_a_typed_error() -> anyhow::Result<()> {
    let f = fixture().await?;
    for m in ["trap", "stack", "resources"] {
        let err = f
            .hostile
            .delete(&mode(m), "vm-1")
            .await
            .err()
            .with_context(|| format!("mode {m} returned"))?;
        assert!(
            matches!(err, CallError::Trap { op: "delete", .. }),
            "{m}: {err:?}"
        );
        assert_plugin_fault(&err);
    }
    assert_serves_next_call(&f.hostile).await
}

#[tokio::test]
async fn output_and_log_spam_is_bounded_and_harmless() -> anyhow::Result<()> {
    let f = fixture().await?;
    let status = f
        .hostile
        .create(&mode("spam"), &vm_spec("spam").build())
        .await?;
    assert_eq!(status.id, "vm-spam");
    assert_serves_next_call(&f.hostile).await
}

#[tokio::test]
async fn hostile_calls_do_not_disturb_a_concurrent_healthy_call() -> anyhow::Result<()> {
    let f = fixture().await?;
    // One task, one thread: the healthy call can only finish first if the spinning guest yields.
    let (grow_ctx, trap_ctx) = (mode("grow"), mode("trap"));
    let (looping, grow, trap, healthy) = tokio::join!(
        async {
            stamped(
                f.hostile
                    .get(&ctx(&[("mode", "loop")], Duration::from_secs(3)), "a")
                    .await,
            )
        },
        f.hostile.get(&grow_ctx, "b"),
        f.hostile.get(&trap_ctx, "c"),
        async {
            stamped(
                f.trivial
                    .create(&mode("ok"), &vm_spec("healthy").build())
                    .await,
            )
        },
    );
    let (healthy, healthy_done) = healthy;
    let (looping, loop_done) = looping;
    assert_eq!(healthy?.id, "vm-healthy");
    assert!(
        healthy_done < loop_done,
        "the healthy call waited for the spinning guest"
    );
    assert!(
        matches!(looping, Err(CallError::Timeout { .. })),
        "{looping:?}"
    );
    assert!(
        matches!(grow, Err(CallError::MemoryLimit { .. })),
        "{grow:?}"
    );
    assert!(matches!(trap, Err(CallError::Trap { .. })), "{trap:?}");
    assert_serves_next_call(&f.hostile).await?;
    assert_serves_next_call(&f.trivial).await
}

/// A loopback HTTP server answering every request with `ok`, counting connections.
async fn http_server() -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    http_server_with_body(b"ok".to_vec()).await
}

async fn http_server_with_body(body: Vec<u8>) -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    Ok((port, connections))
}

#[tokio::test]
async fn http_to_a_host_not_on_the_allowlist_is_refused() -> anyhow::Result<()> {
    let f = fixture().await?;
    let (port, connections) = http_server().await?;
    let authority = format!("127.0.0.1:{port}");
    let call = |allowed: Vec<String>| {
        let plugin = f.hostile.clone();
        let mut ctx = ctx(
            &[("mode", "http"), ("authority", &authority)],
            Duration::from_secs(10),
        );
        async move {
            ctx.egress = EgressPolicy::parse(allowed)?;
            anyhow::Ok(plugin.get(&ctx, "vm-1").await)
        }
    };

    let allowed = call(vec![format!("http://{authority}")]).await??;
    let message = allowed.and_then(|s| s.message).unwrap_or_default();
    assert_eq!(message, "status 200, 2 bytes");
    assert_eq!(connections.load(Ordering::SeqCst), 1);

    for allowlist in [
        vec![],
        vec![format!("http://127.0.0.1:{}", port.wrapping_add(1))],
        vec![format!("https://{authority}")],
        vec!["*.example.com".to_string()],
    ] {
        let result = call(allowlist.clone()).await?;
        let denied = matches!(&result, Err(CallError::Provider(ProviderError::Transient(m))) if m.contains("HttpRequestDenied"));
        anyhow::ensure!(
            denied,
            "allowlist {allowlist:?}: expected a denied request, got {result:?}"
        );
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "a denied request reached the server"
    );
    Ok(())
}

#[tokio::test]
async fn response_bodies_are_bounded() -> anyhow::Result<()> {
    let f = fixture().await?;
    let (port, _) = http_server_with_body(vec![b'x'; 256 << 10]).await?;
    let authority = format!("127.0.0.1:{port}");
    let mut ctx = ctx(
        &[("mode", "http"), ("authority", &authority)],
        Duration::from_secs(10),
    );
    ctx.egress = EgressPolicy::parse([format!("http://{authority}")])?;

    ctx.limits.max_response_bytes = 1 << 20;
    let status = f.hostile.get(&ctx, "vm-1").await?;
    let message = status.and_then(|s| s.message);
    assert_eq!(message.as_deref(), Some("status 200, 262144 bytes"));

    ctx.limits.max_response_bytes = 64 << 10;
    let result = f.hostile.get(&ctx, "vm-1").await;
    let cut = matches!(&result, Err(CallError::Provider(ProviderError::Transient(m))) if m.contains("reading body"));
    anyhow::ensure!(cut, "a 256 KiB body passed a 64 KiB bound: {result:?}");
    Ok(())
}

#[tokio::test]
async fn the_guest_sees_no_environment_arguments_files_or_sockets() -> anyhow::Result<()> {
    let f = fixture().await?;
    // A listening port on loopback, and even the HTTP allowlist naming it: raw TCP stays closed.
    let (port, connections) = http_server().await?;
    let authority = format!("127.0.0.1:{port}");
    let mut ctx = ctx(
        &[("mode", "probe"), ("authority", &authority)],
        Duration::from_secs(10),
    );
    ctx.egress = EgressPolicy::parse([format!("http://{authority}")])?;
    let status = f.hostile.get(&ctx, "vm-1").await?;
    let message = status.and_then(|s| s.message);
    assert_eq!(
        message.as_deref(),
        Some("env=0 args=0 fs=denied tcp=denied")
    );
    assert_eq!(connections.load(Ordering::SeqCst), 0);
    Ok(())
}

#[tokio::test]
async fn concurrent_instances_are_bounded_and_waiting_is_a_host_fault() -> anyhow::Result<()> {
    let f = fixture_with(1).await?;
    // The only slot is held by a call whose request the server keeps unanswered.
    let vmop_tests::gated::Gated {
        port,
        accepted,
        release,
    } = vmop_tests::gated::serve().await?;
    let authority = format!("127.0.0.1:{port}");
    let mut holding = ctx(
        &[("mode", "http"), ("authority", &authority)],
        Duration::from_secs(60),
    );
    holding.egress = EgressPolicy::parse([format!("http://{authority}")])?;
    let hostile = f.hostile.clone();
    let held = tokio::spawn(async move { hostile.get(&holding, "vm-1").await });
    accepted.await?;

    let err = f
        .trivial
        .create(
            &ctx(&[], Duration::from_millis(200)),
            &vm_spec("waiting").build(),
        )
        .await
        .err()
        .context("a second instance ran while the only slot was taken")?;
    assert!(matches!(err, CallError::Instantiate { .. }), "{err:?}");
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        cause.is_some_and(|c| c.contains("no instance slot")),
        "{err:?}"
    );
    assert_eq!(
        (err.fault(), err.class()),
        (Fault::Host, ErrorClass::Transient)
    );

    let _ = release.send(());
    assert!(held.await??.is_some());
    assert_serves_next_call(&f.trivial).await
}
