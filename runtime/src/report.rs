//! How the runtime reports to whoever keeps the operator's telemetry, without knowing it.
//!
//! The runtime sits below the operator: it must not import the operator's metrics or Event
//! types (that made the two import each other). It reports through [`LoadObserver`], which the
//! operator's metrics implement, and formats errors with [`chain`], the one error formatter
//! the runtime's log lines and the operator's conditions, Events and logs share.

use std::time::Duration;

use crate::LoadError;

/// Told of every plugin load that did real work (read, verify, compile or map from the disk
/// cache, `info()`) and of every failed load; loads answered from memory are not reported, so
/// an observer sees what loading costs rather than how often the controller asks.
pub trait LoadObserver: Send + Sync + std::fmt::Debug + 'static {
    /// One load ended after `took`, with `result`.
    fn loaded(&self, result: Result<(), &LoadError>, took: Duration);
}

/// An error and its causes, `": "`-separated, for log lines, conditions and Events.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        // `#[error(transparent)]` layers repeat their source's message.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("inner {0}")]
    struct Inner(u32);

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error(transparent)]
    struct Transparent(Inner);

    #[test]
    fn chain_joins_causes() {
        assert_eq!(chain(&Outer(Inner(7))), "outer: inner 7");
    }

    #[test]
    fn chain_skips_a_transparent_layer_repeating_its_source() {
        assert_eq!(chain(&Transparent(Inner(7))), "inner 7");
    }
}
