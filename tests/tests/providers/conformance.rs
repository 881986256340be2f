//! The conformance suite (`vmop::conformance`, `vmop plugin conformance`) on real
//! components against live loopback backends: it passes the Rust and the Python EC2 providers
//! against moto checking SigV4, the SDK-only `testcloud` provider against the loopback
//! testcloud (`conformance/testcloud.rs`), passes the `machines` control guest, and fails each
//! broken guest on the check that names what it broke, cleaning up after every run.
#![allow(clippy::print_stdout)] // The suite's tables and the cost table are this test's report.

mod testcloud;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use vmop::conformance::{self, CHECKS, Options, Outcome, Report};
use vmop::plugin::{CallContext, CallLimits, EgressPolicy, ProviderSettings};
use vmop_tests::machines::{self, Backend};
use vmop_tests::moto::Moto;
use vmop_tests::operator::IMAGE;

fn options(
    endpoint: &str,
    settings: &[(&str, &str)],
    secrets: &[(&str, &str)],
    image: &str,
) -> anyhow::Result<Options> {
    let pairs = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let ctx = CallContext {
        settings: ProviderSettings {
            settings: pairs(settings),
            secrets: pairs(secrets),
            cluster: "conformance-test".to_owned(),
        },
        egress: EgressPolicy::parse(&[endpoint.to_owned()])?,
        limits: CallLimits::default(),
        label: "conformance-test".to_owned(),
    };
    Ok(Options {
        // Neither backend lags behind its writes; a short grace keeps failing polls short.
        grace: Duration::from_secs(2),
        poll_interval: Duration::from_millis(50),
        ..Options::new(ctx, image)
    })
}

async fn run(guest: &str, options: &Options) -> anyhow::Result<Report> {
    let wasm = vmop_tests::wasm::path(guest)?;
    let report = conformance::run_file(wasm, options).await?;
    println!("{guest}:\n{report}");
    let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
    ensure!(
        names == CHECKS,
        "{guest}: rows {names:?}, expected {CHECKS:?}"
    );
    Ok(report)
}

/// Moto checking SigV4 against an IAM user's key, so `refused-credential` is shown for real.
async fn ec2_against_moto(guest: &str) -> anyhow::Result<()> {
    let (moto, credentials) = Moto::start_with_auth()?;
    let endpoint = moto.endpoint();
    let options = options(
        &endpoint,
        &[("region", "us-east-1"), ("endpoint", &endpoint)],
        &[
            ("access_key_id", &credentials.access_key_id),
            ("secret_access_key", &credentials.secret_access_key),
        ],
        IMAGE,
    )?;
    let report = run(guest, &options).await?;
    ensure!(
        report.passed(),
        "{guest} failed {:?}:\n{report}",
        report.failed()
    );
    let refused = report.check("refused-credential").context("no row")?;
    ensure!(
        refused.outcome == Outcome::Pass,
        "moto authenticates, so the credential check must run: {refused:?}"
    );
    Ok(())
}

#[tokio::test]
async fn rust_ec2_provider_passes_against_moto() -> anyhow::Result<()> {
    ec2_against_moto("vmop_provider_ec2").await
}

#[tokio::test]
async fn python_ec2_provider_passes_against_moto() -> anyhow::Result<()> {
    ec2_against_moto("vmop_provider_ec2_py").await
}

/// Every check ran and passed.
fn passed_every_check(report: &Report) -> anyhow::Result<()> {
    passed_skipping(report, &[])
}

/// Every check passed, and exactly `skips` were skipped.
fn passed_skipping(report: &Report, skips: &[&str]) -> anyhow::Result<()> {
    ensure!(report.passed(), "failed {:?}:\n{report}", report.failed());
    let skipped: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Skip)
        .map(|c| c.name)
        .collect();
    ensure!(skipped == skips, "skipped {skipped:?}:\n{report}");
    Ok(())
}

async fn machines_run(guest: &str) -> anyhow::Result<(Report, Backend)> {
    let backend = Backend::start(Some("t0ken")).await?;
    let options = options(
        &backend.endpoint,
        &[("endpoint", &backend.endpoint)],
        &[("token", "t0ken")],
        machines::IMAGE,
    )?;
    let report = run(guest, &options).await?;
    Ok((report, backend))
}

/// The control guest keeps the SDK's default `list` (no capability): the list checks skip.
#[tokio::test]
async fn control_guest_passes_every_check() -> anyhow::Result<()> {
    let (report, backend) = machines_run("machines").await?;
    passed_skipping(&report, &["list-after-create", "list-after-delete"])?;
    ensure!(
        backend.live().is_empty(),
        "left behind {:?}",
        backend.live()
    );
    Ok(())
}

/// Each broken guest fails exactly the checks that observe its fault, and the suite still
/// deletes every machine it made.
#[tokio::test]
async fn broken_guests_fail_the_named_check() -> anyhow::Result<()> {
    let cases: [(&str, &[&str], &str); 2] = [
        (
            "machines_non_idempotent",
            &["create-idempotent", "gone-after-delete"],
            "two machines",
        ),
        (
            "machines_strict_delete",
            &["delete-again", "delete-unknown"],
            "must succeed",
        ),
    ];
    for (guest, expected, reason) in cases {
        let (report, backend) = machines_run(guest).await?;
        ensure!(
            report.failed() == expected,
            "{guest}: failed {:?}, expected {expected:?}:\n{report}",
            report.failed()
        );
        let first = report.check(expected[0]).context("no row")?;
        ensure!(first.reason.contains(reason), "{guest}: {first:?}");
        ensure!(
            backend.live().is_empty() && backend.created() > 0,
            "{guest}: made {}, left behind {:?}",
            backend.created(),
            backend.live()
        );
    }
    Ok(())
}

/// A plugin that declares `consistent-get` against a cloud whose reads by id lag behind
/// `create` fails `get-after-create`, though the poll finds the machine within the grace.
#[tokio::test]
async fn a_lagging_get_fails_a_declared_consistent_get() -> anyhow::Result<()> {
    let backend = Backend::lagging(None, 2).await?;
    let options = options(
        &backend.endpoint,
        &[("endpoint", &backend.endpoint)],
        &[],
        machines::IMAGE,
    )?;
    let report = run("machines", &options).await?;
    ensure!(
        report.failed() == ["get-after-create"],
        "failed {:?}:\n{report}",
        report.failed()
    );
    let row = report.check("get-after-create").context("no row")?;
    ensure!(
        row.reason.contains("declares consistent-get") && row.reason.contains("2 time(s)"),
        "{row:?}"
    );
    ensure!(
        backend.live().is_empty(),
        "left behind {:?}",
        backend.live()
    );
    Ok(())
}

#[tokio::test]
async fn oversized_output_fails_output_bounds_naming_the_field() -> anyhow::Result<()> {
    let options = options(
        "http://127.0.0.1:9",
        &[("mode", "huge-location")],
        &[],
        "any",
    )?;
    let report = run("hostile", &options).await?;
    let bounds = report.check("output-bounds").context("no row")?;
    ensure!(
        bounds.outcome == Outcome::Fail
            && bounds
                .reason
                .contains("location: location is 1048576 bytes"),
        "{bounds:?}"
    );
    let location = report.check("location").context("no row")?;
    ensure!(location.outcome == Outcome::Fail, "{location:?}");
    Ok(())
}

/// A plugin for another contract fails `info` naming both versions, and nothing else runs.
#[tokio::test]
async fn wrong_wit_versions_fail_info() -> anyhow::Result<()> {
    for (guest, version) in [("wrong_wit", "0.9.0"), ("old_wit", "0.1")] {
        let options = options("http://127.0.0.1:9", &[], &[], "any")?;
        let report = run(guest, &options).await?;
        ensure!(report.failed() == ["info"], "{guest}:\n{report}");
        let info = report.check("info").context("no row")?;
        ensure!(
            info.reason.contains(version) && info.reason.contains(vmop::plugin::WIT_VERSION),
            "{guest}: {info:?}"
        );
        ensure!(
            report
                .checks
                .iter()
                .skip(1)
                .all(|c| c.outcome == Outcome::Skip),
            "{guest}:\n{report}"
        );
    }
    Ok(())
}

/// The CLI wires the same suite: a failing plugin exits non-zero with the table printed.
#[tokio::test]
async fn cli_prints_the_table_and_fails_on_a_failed_check() -> anyhow::Result<()> {
    use clap::Parser as _;
    let wasm = vmop_tests::wasm::path("wrong_wit")?;
    let cli = vmop::cli::Cli::try_parse_from([
        Path::new("vmop"),
        Path::new("plugin"),
        Path::new("conformance"),
        wasm,
        Path::new("--image"),
        Path::new("any"),
    ])?;
    let vmop::cli::Command::Plugin(command) = cli.command else {
        anyhow::bail!("parsed {:?}", cli.command);
    };
    let mut out = Vec::new();
    let result = vmop::cli::plugin::execute(command, &mut out).await;
    let table = String::from_utf8(out)?;
    ensure!(
        result.is_err(),
        "a failed check must fail the command:\n{table}"
    );
    ensure!(
        table.contains("info") && table.contains("FAIL") && table.contains("1 failed"),
        "{table}"
    );
    Ok(())
}

/// One load and call measurement of a provider: size, first load (compile, link, `info()`),
/// cached load (a new registry mapping this process's artifact), and the median of a fresh-
/// Store call without I/O (`start` with an empty config fails `permanent` in both providers
/// before any request) and of a `get` against moto.
struct Costs {
    size: u64,
    first_load: Duration,
    cached_load: Duration,
    call: Duration,
    get: Duration,
}

async fn measure(guest: &str, moto: &Moto) -> anyhow::Result<Costs> {
    use vmop::plugin::{EngineConfig, PluginEngine, PluginRegistry, RegistryConfig};
    let wasm = vmop_tests::wasm::path(guest)?;
    let dir = tempfile::tempdir()?;
    std::fs::copy(wasm, dir.path().join("p.wasm"))?;
    let cache = tempfile::tempdir()?;
    let engine = PluginEngine::new(&EngineConfig::default())?;
    let registry = |engine| {
        PluginRegistry::new(
            engine,
            RegistryConfig {
                plugin_dir: dir.path().to_path_buf(),
                cache_dir: Some(cache.path().to_path_buf()),
                info_limits: CallLimits::default(),
            },
        )
    };
    let first = registry(engine.clone())?;
    let started = std::time::Instant::now();
    first.load("p.wasm", None).await?;
    let first_load = started.elapsed();
    let second = registry(engine)?;
    let started = std::time::Instant::now();
    let plugin = second.load("p.wasm", None).await?;
    let cached_load = started.elapsed();
    ensure!(
        second.stats().disk_hits == 1,
        "{guest}: {:?}",
        second.stats()
    );

    let median = |mut samples: Vec<Duration>| {
        samples.sort();
        samples.get(samples.len() / 2).copied().unwrap_or_default()
    };
    let empty = CallContext::default();
    let mut calls = Vec::new();
    for _ in 0..100 {
        let started = std::time::Instant::now();
        let result = plugin.start(&empty, "i-0").await;
        calls.push(started.elapsed());
        ensure!(
            matches!(
                result,
                Err(vmop::plugin::CallError::Provider(
                    vmop::plugin::ProviderError::Permanent(_)
                ))
            ),
            "{guest}: start answered {result:?}"
        );
    }
    let endpoint = moto.endpoint();
    let options = options(
        &endpoint,
        &[("region", "us-east-1"), ("endpoint", &endpoint)],
        &[("access_key_id", "AKID"), ("secret_access_key", "x")],
        IMAGE,
    )?;
    let mut gets = Vec::new();
    for _ in 0..30 {
        let started = std::time::Instant::now();
        let answer = plugin.get(&options.ctx, "i-0123456789abcdef0").await?;
        gets.push(started.elapsed());
        ensure!(answer.is_none(), "{guest}: {answer:?}");
    }
    Ok(Costs {
        size: std::fs::metadata(wasm)?.len(),
        first_load,
        cached_load,
        call: median(calls),
        get: median(gets),
    })
}

/// The cost table of the Rust and the Python EC2 providers, measured in one run (printed
/// with `--nocapture`; this test binary's profile: wasmtime at opt-level 1).
#[tokio::test]
async fn provider_costs_table() -> anyhow::Result<()> {
    let moto = Moto::start()?;
    println!(
        "| provider | language | size (bytes) | first load ms | cached load ms | call µs | get via moto µs |"
    );
    for (guest, language) in [
        ("vmop_provider_ec2", "Rust"),
        ("vmop_provider_ec2_py", "Python"),
    ] {
        let c = measure(guest, &moto).await?;
        println!(
            "| {guest} | {language} | {} | {} | {:.1} | {} | {} |",
            c.size,
            c.first_load.as_millis(),
            c.cached_load.as_secs_f64() * 1000.0,
            c.call.as_micros(),
            c.get.as_micros()
        );
    }
    Ok(())
}
