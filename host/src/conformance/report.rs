//! The suite's answer: one row per check, with a reason, and the table `vmop plugin
//! conformance` prints.

use std::fmt;
use std::time::Duration;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run, and why is in the reason: the backend cannot show it (it accepts any
    /// credential), or an earlier check left nothing to check.
    Skip,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// Stable name (see [`super::CHECKS`]); tests and CI logs refer to checks by it.
    pub name: &'static str,
    pub outcome: Outcome,
    /// What was observed, for a pass as much as for a failure.
    pub reason: String,
    /// Time spent in the check's plugin calls (polling included).
    pub elapsed: Duration,
}

/// Every check of one run, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// No check failed (skips are not failures: their reasons say what was not shown).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome != Outcome::Fail)
    }

    /// The row of check `name`.
    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The names of the failed checks, in order.
    pub fn failed(&self) -> Vec<&'static str> {
        self.checks
            .iter()
            .filter(|c| c.outcome == Outcome::Fail)
            .map(|c| c.name)
            .collect()
    }

    pub(super) fn push(
        &mut self,
        name: &'static str,
        outcome: Outcome,
        reason: impl Into<String>,
        elapsed: Duration,
    ) {
        self.checks.push(CheckResult {
            name,
            outcome,
            reason: reason.into(),
            elapsed,
        });
    }
}

/// A fixed-width table (check, result, time, reason) and a closing count line.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        writeln!(f, "{:<width$}  RESULT  {:>8}  REASON", "CHECK", "TIME")?;
        for c in &self.checks {
            let ms = format!("{}ms", c.elapsed.as_millis());
            writeln!(
                f,
                "{:<width$}  {:<6}  {ms:>8}  {}",
                c.name,
                c.outcome.as_str(),
                c.reason.replace('\n', " ")
            )?;
        }
        let count = |o| self.checks.iter().filter(|c| c.outcome == o).count();
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Skip)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_fails_the_report_and_the_table_names_it() {
        let mut report = Report::default();
        report.push("info", Outcome::Pass, "ec2 0.1.0", Duration::from_millis(3));
        report.push(
            "refused-credential",
            Outcome::Skip,
            "no secrets",
            Duration::ZERO,
        );
        assert!(report.passed());
        report.push(
            "create-idempotent",
            Outcome::Fail,
            "two machines",
            Duration::ZERO,
        );
        assert!(!report.passed());
        assert_eq!(report.failed(), ["create-idempotent"]);
        let table = report.to_string();
        assert!(table.contains("create-idempotent   FAIL"), "{table}");
        assert!(table.ends_with("1 passed, 1 failed, 1 skipped"), "{table}");
    }
}
