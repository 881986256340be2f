//! `vmop plugin`: inspect or call a provider plugin in the production sandbox, without a
//! cluster. This is how a provider author tries a plugin: the same registry (digest, pin,
//! WIT check), the same Store limits, egress policy, credentials handling (host-side signing
//! or passthrough), redaction and error mapping as the operator.
//!
//! Credentials are read from `--secrets-file` (a YAML or JSON map; `-` reads standard input),
//! never from the command line, where every user of the machine could read them in `ps`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::api::duration;
use crate::api::{
    CredentialsMode, Limits, PluginSource, ProviderConfig, ProviderConfigSpec, SecretRef,
};
use crate::controller::provider_config::apply_credentials;
use vmop_runtime::{
    CallContext, CallError, CallLimits, EgressPolicy, Phase, Plugin, PluginRegistry,
    ProviderSettings, VmSpec, VmStatus,
};

#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Print name, version, WIT version, digest and imports of a plugin file.
    Inspect {
        file: PathBuf,
        /// Refuse the file unless its sha256 is this (hex, optionally `sha256:`-prefixed).
        #[arg(long)]
        pin: Option<String>,
    },
    /// Call `create`, `get` or `delete` in the production sandbox; print the result as JSON.
    Call(CallArgs),
    /// Run the contract suite against a live backend; print a pass/fail table (exit 1 on a failure).
    Conformance(super::conformance::ConformanceArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CallOp {
    Create,
    Get,
    Delete,
}

#[derive(Debug, clap::Args)]
pub struct CallArgs {
    file: PathBuf,
    #[arg(value_enum)]
    op: CallOp,
    /// A `spec.config` entry handed to the plugin (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    config: Vec<(String, String)>,
    /// The cluster mark handed to the plugin (`provider-config.cluster`): what `create` marks
    /// and `list` lists. Use the operator's to see its machines.
    #[arg(long, default_value = "vmop-cli")]
    cluster_id: String,
    /// The credentials Secret's keys: a YAML or JSON map of strings in file F, or `-` for
    /// standard input. Never printed; redacted from everything the plugin says.
    #[arg(long = "secrets-file", value_name = "F")]
    secrets_file: Option<PathBuf>,
    /// How the credentials are used, as `spec.credentials`: `aws-sigv4` (the host signs),
    /// `bearer`, `header`, or `passthrough` (the plugin receives them).
    #[arg(long, value_enum, default_value = "aws-sigv4")]
    credentials: CredentialsArg,
    /// An `allowedHosts` entry (`scheme://host:port`, `*.suffix`; repeatable). None: no network.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_host: Vec<String>,
    /// Let allowed names resolve to loopback and private addresses (`allowPrivateNetworks`).
    #[arg(long)]
    allow_private_networks: bool,
    /// The VM for `create`: a YAML or JSON file with name, namespace, uid, image, cpu,
    /// memoryMib, userData, labels.
    #[arg(long, required_if_eq("op", "create"))]
    spec: Option<PathBuf>,
    /// The cloud's VM id for `get` and `delete`.
    #[arg(long, required_if_eq_any([("op", "get"), ("op", "delete")]))]
    id: Option<String>,
    /// Call time limit, e.g. `30s`, `500ms`, `2m`.
    #[arg(long, default_value = "30s", value_parser = duration::parse_positive)]
    timeout: Duration,
    /// Memory cap, e.g. `128Mi`, `1Gi`, or bytes.
    #[arg(long, default_value = "128Mi", value_parser = parse_bytes)]
    memory: usize,
    /// Refuse the file unless its sha256 is this.
    #[arg(long)]
    pin: Option<String>,
}

/// `spec.credentials` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CredentialsArg {
    #[value(name = "aws-sigv4")]
    AwsSigV4,
    Bearer,
    Header,
    Passthrough,
}

impl From<CredentialsArg> for CredentialsMode {
    fn from(c: CredentialsArg) -> Self {
        match c {
            CredentialsArg::AwsSigV4 => CredentialsMode::AwsSigV4,
            CredentialsArg::Bearer => CredentialsMode::Bearer,
            CredentialsArg::Header => CredentialsMode::Header,
            CredentialsArg::Passthrough => CredentialsMode::Passthrough,
        }
    }
}

pub async fn run(cmd: PluginCommand) -> anyhow::Result<()> {
    let mut buffer = Vec::new();
    let result = execute(cmd, &mut buffer).await;
    std::io::stdout().lock().write_all(&buffer)?;
    result
}

/// Runs `cmd`, writing its JSON result to `out`. A failed call writes its error as JSON too,
/// then returns an error (so the process exits non-zero).
pub async fn execute(cmd: PluginCommand, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match cmd {
        PluginCommand::Inspect { file, pin } => {
            let plugin = load(&file, pin.as_deref(), CallLimits::default()).await?;
            write_json(out, &inspect_json(&plugin))
        }
        PluginCommand::Call(args) => call(args, out).await,
        PluginCommand::Conformance(args) => super::conformance::run(args, out).await,
    }
}

async fn call(args: CallArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let limits = CallLimits {
        timeout: args.timeout,
        memory_bytes: args.memory,
        ..CallLimits::default()
    };
    let settings: BTreeMap<String, String> = args.config.into_iter().collect();
    let secret = match &args.secrets_file {
        Some(path) => read_secrets(path)?,
        None => BTreeMap::new(),
    };
    // The operator's own credentials step, on a ProviderConfig built from the flags.
    let config = ProviderConfig::new(
        "vmop-plugin-call",
        ProviderConfigSpec {
            plugin: PluginSource {
                path: args.file.display().to_string(),
                sha256: None,
            },
            config: settings.clone(),
            credentials_secret_ref: args.secrets_file.as_ref().map(|_| SecretRef {
                namespace: String::new(),
                name: "--secrets-file".to_owned(),
            }),
            credentials: args.credentials.into(),
            allowed_hosts: args.allow_host.clone(),
            allow_private_networks: args.allow_private_networks,
            limits: Limits::default(),
            orphan_policy: Default::default(),
        },
    );
    let egress =
        EgressPolicy::parse(&args.allow_host)?.allow_private_networks(args.allow_private_networks);
    let (secrets, egress) = apply_credentials(&config, secret, egress)?;
    let redactor = egress.redactor().clone();
    let ctx = CallContext {
        settings: ProviderSettings {
            settings,
            secrets,
            cluster: args.cluster_id.clone(),
        },
        egress,
        limits,
        label: "vmop-plugin-call".to_string(),
    };
    let plugin = load(&args.file, args.pin.as_deref(), limits).await?;
    let id = || args.id.clone().unwrap_or_default();
    let result: Result<Value, CallError> = match args.op {
        CallOp::Create => {
            let path = args
                .spec
                .as_deref()
                .context("--spec is required for create")?;
            let spec = read_spec(path)?;
            plugin
                .create(&ctx, &spec)
                .await
                .map(|s| status_json(&redactor.status(s)))
        }
        CallOp::Get => plugin.get(&ctx, &id()).await.map(|s| {
            s.map(|s| redactor.status(s))
                .as_ref()
                .map_or(Value::Null, status_json)
        }),
        CallOp::Delete => plugin
            .delete(&ctx, &id())
            .await
            .map(|()| json!({ "deleted": id() })),
    };
    match result.map_err(|e| e.redacted(&redactor)) {
        Ok(value) => write_json(out, &json!({ "ok": value })),
        Err(e) => {
            write_json(
                out,
                &json!({ "error": {
                    "class": e.class().reason(),
                    "fault": format!("{:?}", e.fault()),
                    "message": format!("{:#}", anyhow::Error::from(e)),
                }}),
            )?;
            anyhow::bail!("plugin call failed")
        }
    }
}

/// Loads `file` through a registry over its directory: exactly the operator's loading path.
async fn load(
    file: &Path,
    pin: Option<&str>,
    limits: CallLimits,
) -> anyhow::Result<std::sync::Arc<Plugin>> {
    let (registry, name) = PluginRegistry::over_file(file, limits)?;
    Ok(registry.load(&name, pin).await?)
}

fn inspect_json(plugin: &Plugin) -> Value {
    let info = plugin.info();
    json!({
        "name": info.name,
        "version": info.version,
        "witVersion": info.wit_version,
        "hostWitVersion": vmop_runtime::WIT_VERSION,
        "capabilities": info.capabilities,
        "sha256": plugin.digest(),
        "imports": plugin.imports(),
    })
}

fn status_json(s: &VmStatus) -> Value {
    json!({
        "id": s.id,
        "phase": Phase::as_str(s.phase),
        "addresses": s.addresses,
        "message": s.message,
    })
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SpecFile {
    name: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    /// Defaults to `cli-<namespace>-<name>`: stable, so repeated creates stay idempotent.
    uid: Option<String>,
    image: String,
    cpu: u32,
    memory_mib: u64,
    user_data: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

fn default_namespace() -> String {
    "default".to_string()
}

fn read_spec(path: &Path) -> anyhow::Result<VmSpec> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read spec file {}", path.display()))?;
    // JSON is YAML, so one parser reads both.
    let spec: SpecFile = serde_norway::from_str(&text)
        .with_context(|| format!("invalid spec file {}", path.display()))?;
    Ok(VmSpec {
        uid: spec
            .uid
            .unwrap_or_else(|| format!("cli-{}-{}", spec.namespace, spec.name)),
        name: spec.name,
        namespace: spec.namespace,
        image: spec.image,
        cpu: spec.cpu,
        memory_mib: spec.memory_mib,
        user_data: spec.user_data,
        labels: spec.labels,
        parameters: BTreeMap::new(),
    })
}

/// The credentials in `path` (`-`: standard input): a YAML or JSON map of strings. Errors name
/// the file, never a value.
fn read_secrets(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
            .context("failed to read the secrets from standard input")?;
        text
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("failed to read secrets file {}", path.display()))?
    };
    // A parse error of serde quotes the offending text: report only where it is.
    serde_norway::from_str::<BTreeMap<String, String>>(&text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" at line {}", l.line()))
            .unwrap_or_default();
        anyhow::anyhow!(
            "secrets file {} is not a map of strings{at}",
            path.display()
        )
    })
}

fn write_json(out: &mut (dyn Write + Send), value: &Value) -> anyhow::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = number.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let factor: usize = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => {
            return Err(format!(
                "invalid size {s:?}: use Ki, Mi, Gi, K, M, G or bytes"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("1Ti").is_err());
        assert_eq!(parse_key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
    }

    #[test]
    fn secrets_come_from_a_file_and_errors_do_not_echo_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.yaml");
        std::fs::write(
            &path,
            "access_key_id: AKID\nsecret_access_key: \"s3cr3t\"\n",
        )
        .unwrap();
        let secrets = read_secrets(&path).unwrap();
        assert_eq!(
            secrets.get("secret_access_key").map(String::as_str),
            Some("s3cr3t")
        );
        std::fs::write(&path, "- s3cr3t-in-a-list\n").unwrap();
        let err = format!("{:#}", read_secrets(&path).unwrap_err());
        assert!(!err.contains("s3cr3t"), "{err}");
        assert!(parse_key_value("=x").is_err());
    }
}
