//! The `vmop` command line, built inside the test package so that integration tests get its
//! path from Cargo (`CARGO_BIN_EXE_vmop-operator`) and always run a binary built from the
//! current sources. Same library, same dispatch as `host/src/main.rs`.

use clap::Parser;

#[tokio::main]
async fn main() {
    let result = vmop::cli::Cli::parse().execute().await;
    std::process::exit(vmop::cli::exit_code(&result));
}
