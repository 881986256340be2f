//! The `vmop` command line. `main.rs` parses [`Cli`] and dispatches; each subcommand lives in
//! its own module.

pub mod conformance;
pub mod crds;
pub mod plan;
pub mod plugin;
pub mod run;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use http::HeaderValue;
use http::header::USER_AGENT;

use crate::telemetry::logging::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "vmop",
    version,
    about = "Virtual machines on external clouds, through WebAssembly provider plugins"
)]
pub struct Cli {
    /// Log format: `json` for production, `text` for terminals.
    #[arg(long, env = "VMOP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster in KUBECONFIG or the in-cluster config.
    Run(run::RunArgs),
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Inspect or call a provider plugin in the production sandbox, without a cluster.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Dry run: what the operator would do next for each VirtualMachine, and why, from
    /// read-only provider calls. Exits 2 when something would change.
    Plan(plan::PlanArgs),
    /// Internal: compile the component on stdin, write wasmtime's artifact on stdout (what
    /// `vmop run` runs to compile a plugin outside its own memory; see `plugin::precompile`).
    #[command(name = vmop_runtime::precompile::SUBCOMMAND, hide = true)]
    Precompile,
}

impl Cli {
    /// Installs logging and runs the chosen subcommand: everything `main` does after parsing.
    /// Shared by the `vmop` binary and the test package's copy of it.
    pub async fn execute(self) -> anyhow::Result<()> {
        crate::telemetry::logging::init(self.log_format)?;
        match self.command {
            Command::Run(args) => run::run(args).await,
            Command::Crds => crds::print(),
            Command::Plugin(args) => plugin::run(args).await,
            Command::Plan(args) => plan::run(args).await,
            Command::Precompile => Ok(vmop_runtime::precompile::serve(
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )?),
        }
    }
}

/// The process exit code for the outcome of [`Cli::execute`]: 0, 2 when `vmop plan` found
/// changes, 1 for any other error (printed).
pub fn exit_code(result: &anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) if e.is::<plan::Changes>() => 2,
        Err(e) => {
            eprintln!("Error: {e:?}");
            1
        }
    }
}

/// A client for the cluster in KUBECONFIG or the in-cluster config, introducing itself as
/// `vmop/<version>`: the API server names the field manager of an update after the user agent
/// (kube sends none, which it records as `unknown`), so this is what makes
/// [`crate::api::MANAGER`] the manager of every write, and what audit logs show.
pub async fn kube_client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer()
        .await
        .context("failed to find a Kubernetes config in KUBECONFIG or the in-cluster config")?;
    config.headers.push((
        USER_AGENT,
        HeaderValue::from_static(concat!("vmop/", env!("CARGO_PKG_VERSION"))),
    ));
    kube::Client::try_from(config).context("failed to build a Kubernetes client")
}

/// This cluster's identity, the mark on every machine vmop makes (`provider-config.cluster`):
/// `flag` when given, else the uid of the `kube-system` namespace, which lives as long as the
/// cluster and differs between clusters (the convention of other cluster-identifying tools).
pub async fn cluster_id(client: &kube::Client, flag: Option<&str>) -> anyhow::Result<String> {
    if let Some(id) = flag {
        return Ok(id.to_owned());
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    namespaces
        .get("kube-system")
        .await
        .context(
            "failed to read the uid of namespace kube-system (this cluster's identity): \
             grant `get` on it or set --cluster-id",
        )?
        .metadata
        .uid
        .context("namespace kube-system has no uid")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
