//! The `vmop` command line. `main.rs` parses [`Cli`] and dispatches; each subcommand lives in
//! its own module.

pub mod crds;
pub mod plugin;
pub mod run;

use clap::{Parser, Subcommand};

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
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
