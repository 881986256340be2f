//! The operator's HTTP endpoints over a real socket: `/healthz`, `/readyz` following the
//! readiness flag, and `/metrics` exporting the controller-runtime and `vmop_*` names that
//! dashboards and alerts query, in both text formats; log lines of a reconcile carry its
//! object and ProviderConfig and never a credential.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::oneshot;
use vmop::api::VmPhase;
use vmop::plugin::{Operation, ProviderSettings};
use vmop::telemetry::health::Readiness;
use vmop::telemetry::logging::{LogFormat, subscriber};
use vmop::telemetry::metrics::{
    CallOutcome, ControllerKind, Format, LoadOutcome, Metrics, OPENMETRICS_CONTENT_TYPE,
    ReconcileResult,
};
use vmop::telemetry::server::{RunningServer, ServerError, ServerState, serve};
use vmop::telemetry::spans::reconcile_span;

const DEADLINE: Duration = Duration::from_secs(30);

struct Reply {
    status: u16,
    content_type: Option<String>,
    body: String,
}

/// A minimal HTTP/1.1 GET: one request per connection, the server closes it after answering.
async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> anyhow::Result<Reply> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(DEADLINE, exchange)
        .await
        .context("no answer in time")??;
    let (head, body) = raw.split_once("\r\n\r\n").context("no end of headers")?;
    let mut lines = head.lines();
    let status_line = lines.next().context("empty response")?;
    let status = status_line
        .split(' ')
        .nth(1)
        .context("no status code")?
        .parse()?;
    let content_type = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-type")
            .then(|| value.trim().to_owned())
    });
    Ok(Reply {
        status,
        content_type,
        body: body.to_owned(),
    })
}

/// Serves on a free loopback port until the returned sender is used or dropped.
async fn start(state: ServerState) -> anyhow::Result<(RunningServer, oneshot::Sender<()>)> {
    let (stop, stopped) = oneshot::channel::<()>();
    let server = serve(([127, 0, 0, 1], 0).into(), state, async {
        let _ = stopped.await;
    })
    .await?;
    Ok((server, stop))
}

#[tokio::test]
async fn healthz_is_always_ok_and_readyz_follows_the_readiness_flag() -> anyhow::Result<()> {
    let readiness = Readiness::new();
    let state = ServerState {
        metrics: Metrics::new(),
        readiness: readiness.clone(),
    };
    let (server, stop) = start(state).await?;
    let addr = server.local_addr();
    ensure!(addr.port() != 0, "the bound port is reported");

    ensure!(get(addr, "/healthz", None).await?.status == 200);
    let before = get(addr, "/readyz", None).await?;
    ensure!(before.status == 503, "ready before the caches synced");
    readiness.set_ready(true);
    ensure!(get(addr, "/readyz", None).await?.status == 200);
    ensure!(get(addr, "/healthz", None).await?.status == 200);
    ensure!(get(addr, "/nothing-here", None).await?.status == 404);

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, server.wait())
        .await
        .context("the server did not stop")??;
    ensure!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
    Ok(())
}

/// Records one of everything the operator records.
fn record(metrics: &Metrics) {
    metrics.set_max_concurrent_reconciles(ControllerKind::VirtualMachine, 16);
    let failed = metrics.reconcile_started(ControllerKind::VirtualMachine);
    let ok = metrics.reconcile_started(ControllerKind::ProviderConfig);
    failed.finish(ReconcileResult::Error, true);
    ok.finish(ReconcileResult::RequeueAfter, false);
    metrics.provider_call(
        "aws",
        Operation::Create,
        CallOutcome::RateLimited,
        Duration::from_millis(30),
    );
    metrics.plugin_load(LoadOutcome::Ok, Duration::from_millis(3));
    metrics.set_leader("vmop", true);
    metrics.count_virtual_machines_with(|| {
        [Some(VmPhase::Running), Some(VmPhase::Running), None]
            .into_iter()
            .collect()
    });
}

/// Every series dashboards query, with the exact exported name and labels.
const EXPECTED: &[&str] = &[
    r#"controller_runtime_reconcile_total{controller="virtualmachine",result="error"} 1"#,
    r#"controller_runtime_reconcile_total{controller="providerconfig",result="requeue_after"} 1"#,
    r#"controller_runtime_reconcile_errors_total{controller="virtualmachine"} 1"#,
    r#"controller_runtime_terminal_reconcile_errors_total{controller="virtualmachine"} 1"#,
    r#"controller_runtime_reconcile_time_seconds_count{controller="virtualmachine"} 1"#,
    r#"controller_runtime_max_concurrent_reconciles{controller="virtualmachine"} 16"#,
    r#"controller_runtime_active_workers{controller="virtualmachine"} 0"#,
    r#"leader_election_master_status{name="vmop"} 1"#,
    r#"vmop_provider_calls_total{provider_config="aws",operation="create",outcome="rate_limited"} 1"#,
    r#"vmop_provider_call_duration_seconds_count{provider_config="aws",operation="create",outcome="rate_limited"} 1"#,
    r#"vmop_plugin_load_seconds_count{outcome="ok"} 1"#,
    r#"vmop_virtual_machines{phase="Running"} 2"#,
    r#"vmop_virtual_machines{phase="Pending"} 1"#,
    r#"vmop_virtual_machines{phase="Failed"} 0"#,
];

/// The lines of `expected` that `text` lacks, plus the `+Inf` bucket of the reconcile time
/// histogram (whose label order differs between the formats).
fn missing<'a>(text: &str, expected: &[&'a str]) -> Vec<&'a str> {
    let mut absent: Vec<_> = expected
        .iter()
        .copied()
        .filter(|line| !text.lines().any(|l| l == *line))
        .collect();
    let inf_bucket = text.lines().any(|l| {
        l.starts_with("controller_runtime_reconcile_time_seconds_bucket{")
            && l.contains(r#"controller="virtualmachine""#)
            && l.contains(r#"le="+Inf""#)
            && l.ends_with("} 1")
    });
    if !inf_bucket {
        absent.push("controller_runtime_reconcile_time_seconds_bucket{..le=\"+Inf\"} 1");
    }
    absent
}

#[tokio::test]
async fn metrics_export_controller_runtime_and_vmop_names_in_both_formats() -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let state = ServerState {
        metrics: metrics.clone(),
        readiness: Readiness::new(),
    };
    let (server, _stop) = start(state).await?;
    let addr = server.local_addr();
    record(&metrics);

    // Prometheus offers OpenMetrics first.
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let open = get(addr, "/metrics", Some(accept)).await?;
    ensure!(open.status == 200);
    ensure!(open.content_type.as_deref() == Some(OPENMETRICS_CONTENT_TYPE));
    let absent = missing(&open.body, EXPECTED);
    ensure!(absent.is_empty(), "missing {absent:?} in\n{}", open.body);
    ensure!(open.body.ends_with("# EOF\n"));
    ensure!(
        !open.body.contains("_total_total"),
        "a counter suffixed twice"
    );

    let classic = get(addr, "/metrics", None).await?;
    ensure!(classic.status == 200);
    ensure!(classic.content_type.as_deref() == Some(Format::Prometheus.content_type()));
    let absent = missing(&classic.body, EXPECTED);
    ensure!(absent.is_empty(), "missing {absent:?} in\n{}", classic.body);
    let types = [
        "# TYPE controller_runtime_reconcile_total counter",
        "# TYPE controller_runtime_reconcile_time_seconds histogram",
        "# TYPE vmop_virtual_machines gauge",
    ];
    let absent = missing(&classic.body, &types);
    ensure!(absent.is_empty(), "missing {absent:?}");
    Ok(())
}

#[test]
fn active_workers_count_reconciles_in_flight_including_cancelled_ones() -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let line =
        |n: u8| format!(r#"controller_runtime_active_workers{{controller="virtualmachine"}} {n}"#);
    let first = metrics.reconcile_started(ControllerKind::VirtualMachine);
    let second = metrics.reconcile_started(ControllerKind::VirtualMachine);
    let text = metrics.encode(Format::Prometheus)?;
    ensure!(text.lines().any(|l| l == line(2)), "{text}");
    first.finish(ReconcileResult::Success, false);
    // Cancelled (e.g. leadership lost): released, but not counted as a reconcile.
    drop(second);
    let text = metrics.encode(Format::Prometheus)?;
    ensure!(text.lines().any(|l| l == line(0)), "{text}");
    let total =
        r#"controller_runtime_reconcile_total{controller="virtualmachine",result="success"} 1"#;
    ensure!(text.lines().any(|l| l == total), "{text}");
    Ok(())
}

#[test]
fn no_vm_gauge_before_a_source_and_deleted_provider_configs_are_forgotten() -> anyhow::Result<()> {
    let metrics = Metrics::new();
    metrics.provider_call(
        "gone",
        Operation::Get,
        CallOutcome::Ok,
        Duration::from_millis(1),
    );
    let text = metrics.encode(Format::Prometheus)?;
    ensure!(!text.contains("vmop_virtual_machines"), "{text}");
    ensure!(text.contains(r#"provider_config="gone""#), "{text}");
    metrics.forget_provider_config("gone");
    let text = metrics.encode(Format::Prometheus)?;
    ensure!(!text.contains(r#"provider_config="gone""#), "{text}");
    Ok(())
}

#[tokio::test]
async fn an_address_in_use_is_reported_when_binding() -> anyhow::Result<()> {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = taken.local_addr()?;
    let state = ServerState {
        metrics: Metrics::new(),
        readiness: Readiness::new(),
    };
    match serve(addr, state, std::future::pending()).await {
        Err(ServerError::Bind { addr: reported, .. }) if reported == addr => Ok(()),
        Err(other) => bail!("unexpected error: {other:?}"),
        Ok(server) => bail!("bound {} although it is taken", server.local_addr()),
    }
}

/// Log output captured in memory.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

/// Logs one line inside a reconcile span, as the controller does, with the provider settings
/// (whose secrets must not appear).
fn log_a_reconcile(format: LogFormat) -> anyhow::Result<String> {
    let capture = Capture::default();
    let filter = tracing_subscriber::EnvFilter::new("info");
    let settings = ProviderSettings {
        settings: BTreeMap::from([("region".to_owned(), "eu-west-1".to_owned())]),
        secrets: BTreeMap::from([("secret_access_key".to_owned(), "hunter2-s3cr3t".to_owned())]),
        cluster: "vmop-tests".to_owned(),
    };
    tracing::subscriber::with_default(subscriber(format, filter, capture.clone(), false), || {
        let span = reconcile_span(
            ControllerKind::VirtualMachine,
            Some("team-a"),
            "web-1",
            Some("aws"),
        );
        let _entered = span.enter();
        tracing::info!(?settings, "calling the provider");
    });
    let bytes = capture
        .0
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    Ok(String::from_utf8(bytes)?)
}

#[test]
fn json_log_lines_of_a_reconcile_name_its_object_and_never_a_secret() -> anyhow::Result<()> {
    let out = log_a_reconcile(LogFormat::Json)?;
    ensure!(
        !out.contains("hunter2-s3cr3t"),
        "a secret was logged: {out}"
    );
    let line = out.lines().next().context("no log line")?;
    let json: serde_json::Value = serde_json::from_str(line)?;
    let span = &json["span"];
    ensure!(span["controller"] == "virtualmachine", "{line}");
    ensure!(span["namespace"] == "team-a", "{line}");
    ensure!(span["object"] == "web-1", "{line}");
    ensure!(span["provider_config"] == "aws", "{line}");
    ensure!(span["name"] == "reconcile", "{line}");
    ensure!(
        json["fields"]["message"] == "calling the provider",
        "{line}"
    );
    ensure!(json["level"] == "INFO", "{line}");
    let settings = json["fields"]["settings"].as_str().unwrap_or_default();
    ensure!(settings.contains("secret_access_key"), "{line}");
    ensure!(out.lines().count() == 1, "{out}");
    Ok(())
}

#[test]
fn text_log_lines_of_a_reconcile_name_its_object_and_never_a_secret() -> anyhow::Result<()> {
    let out = log_a_reconcile(LogFormat::Text)?;
    ensure!(
        !out.contains("hunter2-s3cr3t"),
        "a secret was logged: {out}"
    );
    for field in [
        "controller=\"virtualmachine\"",
        "namespace=\"team-a\"",
        "object=\"web-1\"",
        "provider_config=\"aws\"",
    ] {
        ensure!(out.contains(field), "{field} missing in {out}");
    }
    Ok(())
}
