//! `vmop plugin conformance`: the contract suite ([`crate::conformance`]) against a
//! live backend, as a table; the exit code fails CI when a check fails. This module only
//! turns flags into [`Options`] and the report into text.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use crate::conformance::{self, Options};
use vmop_runtime::{CallContext, CallLimits, EgressPolicy, ProviderSettings};

#[derive(Debug, clap::Args)]
pub struct ConformanceArgs {
    /// The plugin file (`.wasm`).
    file: PathBuf,
    /// An image the backend can boot: the suite creates one machine from it, and deletes it.
    #[arg(long)]
    image: String,
    /// A `spec.config` entry handed to the plugin (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    config: Vec<(String, String)>,
    /// The cluster mark of the machines the suite makes (`provider-config.cluster`); the
    /// `list` checks see only machines that carry it.
    #[arg(long, default_value = "vmop-conformance")]
    cluster_id: String,
    /// The credentials, as a YAML or JSON mapping of key to value (a Secret's `stringData`);
    /// never printed. Check `refused-credential` falsifies them.
    #[arg(long, value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// An `allowedHosts` entry (`scheme://host:port`, `*.suffix`; repeatable). None: no network.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_host: Vec<String>,
    /// `spec.cpu` of the machine the suite creates.
    #[arg(long, default_value_t = 1)]
    cpu: u32,
    /// Its memory, in MiB.
    #[arg(long, default_value_t = 512)]
    memory_mib: u64,
    /// The image of check `impossible-spec`: one the backend must not have.
    #[arg(long, default_value = "vmop-conformance-no-such-image")]
    impossible_image: String,
    /// How long a machine may take to appear after create or vanish after delete (the
    /// ProviderConfig's creation grace period).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    grace_seconds: u64,
    /// Time limit of each call (the ProviderConfig's call timeout).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    timeout_seconds: u64,
    /// Memory cap of each call, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 128)]
    memory_cap_mib: usize,
}

/// Runs the suite and writes its table to `out`; an error (exit code 1) when a check failed.
pub async fn run(args: ConformanceArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let secrets = match &args.secrets_file {
        Some(path) => read_secrets(path)?,
        None => BTreeMap::new(),
    };
    let ctx = CallContext {
        settings: ProviderSettings {
            settings: args.config.into_iter().collect(),
            secrets,
            cluster: args.cluster_id.clone(),
        },
        egress: EgressPolicy::parse(&args.allow_host)?,
        limits: CallLimits {
            timeout: Duration::from_secs(args.timeout_seconds),
            memory_bytes: args.memory_cap_mib.saturating_mul(1 << 20),
            ..CallLimits::default()
        },
        label: "vmop-plugin-conformance".to_owned(),
    };
    let options = Options {
        cpu: args.cpu,
        memory_mib: args.memory_mib,
        impossible_image: args.impossible_image,
        grace: Duration::from_secs(args.grace_seconds),
        ..Options::new(ctx, args.image)
    };
    let report = conformance::run_file(&args.file, &options).await?;
    writeln!(out, "{report}")?;
    let failed = report.failed();
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("conformance failed: {}", failed.join(", "))
    }
}

fn read_secrets(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read secrets file {}", path.display()))?;
    // JSON is YAML, so one parser reads both. The error names the file, never its content.
    serde_norway::from_str(&text).map_err(|_| {
        anyhow::anyhow!(
            "secrets file {} is not a mapping of key to string value",
            path.display()
        )
    })
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_files_are_mappings_and_errors_quote_no_value() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.yaml");
        std::fs::write(&good, "access_key_id: AKID\nsecret_access_key: s3cr3t\n").unwrap();
        let secrets = read_secrets(&good).unwrap();
        assert_eq!(
            secrets.get("secret_access_key").map(String::as_str),
            Some("s3cr3t")
        );
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "- s3cr3t\n").unwrap();
        let err = format!("{:#}", read_secrets(&bad).unwrap_err());
        assert!(!err.contains("s3cr3t"), "{err}");
    }
}
