//! The `vmop` command line, built inside the test package so that integration tests get its
//! path from Cargo (`CARGO_BIN_EXE_vmop-operator`) and always run a binary built from the
//! current sources. Same library, same dispatch as `host/src/main.rs`.

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
