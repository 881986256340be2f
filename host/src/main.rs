use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vmop::cli::Cli::parse().execute().await
}
