//! `tracing` subscriber setup: JSON for production log pipelines, text for terminals.

use tracing_subscriber::fmt::MakeWriter;
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
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    subscriber(format, filter, std::io::stderr, ansi)
        .try_init()
        .map_err(LoggingError::Install)
}

/// The subscriber [`init`] installs, writing to `writer` (tests capture the lines this way).
/// `ansi` colours the text format; [`init`] enables it only when stderr is a terminal, so that
/// `kubectl logs` of a text-format operator shows no escape codes.
/// JSON lines carry the fields of the current span under `span` and of every enclosing span
/// under `spans`, so a reconcile's lines can be filtered by its object.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => {
            Box::new(registry.with(fmt::layer().json().with_ansi(false).with_writer(writer)))
        }
        LogFormat::Text => {
            Box::new(registry.with(fmt::layer().with_ansi(ansi).with_writer(writer)))
        }
    }
}
