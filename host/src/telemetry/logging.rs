//! `tracing` subscriber setup: JSON for production log pipelines, text for terminals.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("failed to install the global log subscriber")]
    Install(#[source] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` filter.
/// Logs go to stderr so that stdout stays free for command output (`vmop crds`, `vmop plugin`).
pub fn init(format: LogFormat) -> Result<(), LoggingError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Text => registry.with(fmt::layer().with_writer(std::io::stderr)).try_init(),
    }
    .map_err(LoggingError::Install)
}
