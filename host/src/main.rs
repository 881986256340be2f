use clap::Parser;

#[tokio::main]
async fn main() {
    let result = vmop::cli::Cli::parse().execute().await;
    std::process::exit(vmop::cli::exit_code(&result));
}
