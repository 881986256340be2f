use clap::Parser;
use vmop::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    vmop::telemetry::logging::init(cli.log_format)?;
    match cli.command {
        Command::Run(args) => vmop::cli::run::run(args).await,
        Command::Crds => vmop::cli::crds::print(),
        Command::Plugin(args) => vmop::cli::plugin::run(args).await,
    }
}
