//! `vmop crds`: prints the CustomResourceDefinitions.

pub fn print() -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
