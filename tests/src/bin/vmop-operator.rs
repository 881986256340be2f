//! The `vmop` command line, built inside the test package so that integration tests get its
//! path from Cargo (`CARGO_BIN_EXE_vmop-operator`) and always run a binary built from the
//! current sources. Same library, same dispatch as `host/src/main.rs`.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vmop::cli::Cli::parse().execute().await
}
