//! The cost of each real provider, as the operator pays it: component size; first load through
//! a registry with an empty artifact cache (compile, store the artifact, link, `info()`);
//! cached load (a new registry over the same cache: verified read, deserialize, link,
//! `info()`); one call without I/O (`start` with an empty config fails `permanent` before any
//! request, in every provider: fresh Store, instantiate, call, drop); one `get` against the
//! provider's loopback backend; and the conformance kit's result against that backend.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use vmop::conformance::{self, Options, Outcome};
use vmop::plugin::{
    CallContext, CallError, CallLimits, EgressPolicy, EngineConfig, Plugin, PluginEngine,
    PluginRegistry, ProviderError, ProviderSettings, RegistryConfig,
};
use vmop_tests::cloud::{self, Cloud};
use vmop_tests::moto::Moto;

/// The providers measured: (built guest, provider, language).
pub const PROVIDERS: [(&str, &str, &str); 4] = [
    ("vmop_provider_ec2", "ec2", "Rust"),
    ("vmop_provider_testcloud", "testcloud", "Rust"),
    ("vmop_provider_ec2_py", "ec2", "Python"),
    ("vmop_provider_testcloud_py", "testcloud", "Python"),
];

const CACHED_LOADS: usize = 5;
const TOKEN: &str = "bench-token";

/// One provider's row.
#[derive(Debug)]
pub struct Row {
    pub provider: &'static str,
    pub language: &'static str,
    pub size: u64,
    pub first_load: Duration,
    pub cached_load: Duration,
    pub call: Duration,
    pub calls: usize,
    pub get: Duration,
    pub backend: &'static str,
    pub conformance: String,
}

impl Row {
    pub const HEADER: &'static str = "| provider | language | size (bytes) | first compile ms | cached load ms | per-call µs | get µs (backend) | conformance |\n|---|---|---|---|---|---|---|---|";
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "| {} | {} | {} | {:.0} | {:.2} | {:.1} (median of {}) | {:.0} ({}) | {} |",
            self.provider,
            self.language,
            self.size,
            super::micros(self.first_load) / 1000.0,
            super::micros(self.cached_load) / 1000.0,
            super::micros(self.call),
            self.calls,
            super::micros(self.get),
            self.backend,
            self.conformance
        )
    }
}

/// The live backend a provider's get and conformance run go to.
enum Backend {
    Moto(Moto, vmop_tests::moto::AwsCredentials),
    TestCloud(Cloud),
}

impl Backend {
    async fn for_provider(provider: &str) -> anyhow::Result<Backend> {
        Ok(if provider == "testcloud" {
            Backend::TestCloud(Cloud::start(cloud::Config::default().with_token(TOKEN)).await?)
        } else {
            let (moto, credentials) = Moto::start_with_auth()?;
            Backend::Moto(moto, credentials)
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Moto(..) => "moto",
            Backend::TestCloud(_) => "testcloud",
        }
    }

    fn options(&self) -> anyhow::Result<Options> {
        let (endpoint, settings, secrets, image) = match self {
            Backend::Moto(moto, credentials) => {
                let endpoint = moto.endpoint();
                (
                    endpoint.clone(),
                    vec![("region", "us-east-1".to_owned()), ("endpoint", endpoint)],
                    vec![
                        ("access_key_id", credentials.access_key_id.clone()),
                        ("secret_access_key", credentials.secret_access_key.clone()),
                    ],
                    vmop_tests::operator::IMAGE,
                )
            }
            Backend::TestCloud(cloud) => (
                cloud.endpoint().to_owned(),
                vec![("endpoint", cloud.endpoint().to_owned())],
                vec![("token", TOKEN.to_owned())],
                cloud::IMAGE,
            ),
        };
        let pairs = |kv: Vec<(&str, String)>| -> BTreeMap<String, String> {
            kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
        };
        let ctx = CallContext {
            settings: ProviderSettings {
                settings: pairs(settings),
                secrets: pairs(secrets),
                cluster: "vmop-tests".to_owned(),
            },
            egress: EgressPolicy::parse(&[endpoint])?,
            limits: CallLimits::default(),
            label: "bench".to_owned(),
        };
        Ok(Options {
            grace: Duration::from_secs(5),
            poll_interval: Duration::from_millis(50),
            ..Options::new(ctx, image)
        })
    }
}

fn registry(dir: &Path, cache: &Path) -> anyhow::Result<PluginRegistry> {
    let engine = PluginEngine::new(&EngineConfig::default())?;
    Ok(PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: dir.to_path_buf(),
            cache_dir: Some(cache.to_path_buf()),
            info_limits: CallLimits::default(),
        },
    )?)
}

/// First and cached load (median of [`CACHED_LOADS`] new registries), and the last plugin.
async fn loads(wasm: &Path) -> anyhow::Result<(Duration, Duration, Arc<Plugin>)> {
    let dir = tempfile::tempdir()?;
    std::fs::copy(wasm, dir.path().join("p.wasm"))?;
    let cache = tempfile::tempdir()?;
    let first = registry(dir.path(), cache.path())?;
    let started = Instant::now();
    first.load(Path::new("p.wasm"), None).await?;
    let first_load = started.elapsed();
    let mut cached = Vec::with_capacity(CACHED_LOADS);
    let mut plugin = None;
    for _ in 0..CACHED_LOADS {
        let again = registry(dir.path(), cache.path())?;
        let started = Instant::now();
        plugin = Some(again.load(Path::new("p.wasm"), None).await?);
        cached.push(started.elapsed());
        ensure!(again.stats().disk_hits == 1, "{:?}", again.stats());
    }
    let plugin = plugin.context("no cached load ran")?;
    Ok((first_load, super::median(cached), plugin))
}

/// Median of `n` calls of `start` with an empty config, each answering `permanent`.
async fn call_median(plugin: &Plugin, n: usize) -> anyhow::Result<Duration> {
    let empty = CallContext::default();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let result = plugin.start(&empty, "i-0").await;
        samples.push(started.elapsed());
        ensure!(
            matches!(
                result,
                Err(CallError::Provider(ProviderError::Permanent(_)))
            ),
            "start answered {result:?}"
        );
    }
    Ok(super::median(samples))
}

async fn get_median(plugin: &Plugin, ctx: &CallContext, n: usize) -> anyhow::Result<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let answer = plugin.get(ctx, "i-0123456789abcdef0").await?;
        samples.push(started.elapsed());
        ensure!(answer.is_none(), "{answer:?}");
    }
    Ok(super::median(samples))
}

/// Measures one provider; `calls`: how many no-I/O calls the median is of.
pub async fn measure(
    guest: &str,
    provider: &'static str,
    language: &'static str,
    calls: usize,
) -> anyhow::Result<Row> {
    let wasm = vmop_tests::wasm::path(guest)?;
    let (first_load, cached_load, plugin) = loads(wasm).await?;
    let call = call_median(&plugin, calls).await?;
    let backend = Backend::for_provider(provider).await?;
    let options = backend.options()?;
    let get = get_median(&plugin, &options.ctx, 50).await?;
    let report = conformance::run_file(wasm, &options).await?;
    let count = |o| report.checks.iter().filter(|c| c.outcome == o).count();
    let conformance = format!(
        "{} ({} pass, {} fail, {} skip)",
        if report.passed() { "pass" } else { "FAIL" },
        count(Outcome::Pass),
        count(Outcome::Fail),
        count(Outcome::Skip)
    );
    Ok(Row {
        provider,
        language,
        size: std::fs::metadata(wasm)?.len(),
        first_load,
        cached_load,
        call,
        calls,
        get,
        backend: backend.name(),
        conformance,
    })
}
