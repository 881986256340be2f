//! Every plugin call of a run, timed and remembered, so that the bounds and time-limit checks
//! judge all of them, not just the ones a check looked at.

use std::time::{Duration, Instant};

use vmop_runtime::sandbox::CallError;

/// One call's record.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub op: &'static str,
    pub elapsed: Duration,
    /// The contract violation, as the host reported it (field and bound, never content).
    pub violation: Option<String>,
    pub timed_out: bool,
}

/// The calls made so far.
#[derive(Debug, Default)]
pub(super) struct Calls {
    pub all: Vec<Call>,
}

impl Calls {
    /// Runs `call` (one plugin call named `op`) and records it.
    pub async fn run<T>(
        &mut self,
        op: &'static str,
        call: impl Future<Output = Result<T, CallError>>,
    ) -> Result<T, CallError> {
        let started = Instant::now();
        let result = call.await;
        let (violation, timed_out) = match &result {
            Err(CallError::ContractViolation { violation, .. }) => {
                (Some(violation.to_string()), false)
            }
            Err(CallError::Timeout { .. }) => (None, true),
            _ => (None, false),
        };
        self.all.push(Call {
            op,
            elapsed: started.elapsed(),
            violation,
            timed_out,
        });
        result
    }

    /// The time spent in calls since record `from` (an index into [`Calls::all`]).
    pub fn elapsed_since(&self, from: usize) -> Duration {
        self.all.iter().skip(from).map(|c| c.elapsed).sum()
    }
}

/// An error with its whole chain of causes, on one line: the report's reason.
pub(super) fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
