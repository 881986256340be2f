//! `vmop plugin`: inspect or call a provider plugin in the production sandbox.

#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Print name, version, WIT version, digest and imports of a plugin file.
    Inspect {
        file: std::path::PathBuf,
    },
}

pub async fn run(_cmd: PluginCommand) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
