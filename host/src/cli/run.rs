//! `vmop run`: the operator.

#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub async fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
