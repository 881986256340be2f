//! After the checks: delete what the run made, then judge every call of the run against
//! the WIT bounds and the time limit.

use super::calls::describe;
use super::suite::{Suite, Verdict};
use vmop_runtime::Plugin;

impl Suite<'_> {
    /// Deletes what the run made, then judges the calls of the whole run.
    pub(super) async fn cleanup(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        for uid in self.uids.clone() {
            if let Ok(Some(s)) = self.calls.run("find", plugin.find(self.ctx(), &uid)).await {
                self.deleted.remove(&s.id);
                self.created.insert(s.id);
            }
        }
        let mut failures = Vec::new();
        let pending: Vec<String> = self.created.difference(&self.deleted).cloned().collect();
        for id in &pending {
            if let Err(e) = self
                .calls
                .run("delete", plugin.delete(self.ctx(), id))
                .await
            {
                failures.push(format!("{id}: {}", describe(&e)));
            }
        }
        let bounds = self.bounds_verdict();
        let time = self.time_verdict();
        self.record("output-bounds", self.calls.all.len(), bounds);
        self.record("call-time", self.calls.all.len(), time);
        let verdict = if failures.is_empty() {
            Ok(format!(
                "{} machine(s) made, {} left to delete and deleted",
                self.created.len(),
                pending.len()
            ))
        } else {
            Err(format!("could not delete {}", failures.join("; ")))
        };
        self.record("cleanup", mark, verdict);
    }

    pub(super) fn bounds_verdict(&self) -> Verdict {
        let violations: Vec<String> = self
            .calls
            .all
            .iter()
            .filter_map(|c| c.violation.as_ref().map(|v| format!("{}: {v}", c.op)))
            .collect();
        if violations.is_empty() {
            Ok(format!(
                "{} calls, every answer within the WIT bounds",
                self.calls.all.len()
            ))
        } else {
            Err(violations.join("; "))
        }
    }

    pub(super) fn time_verdict(&self) -> Verdict {
        let limit = self.ctx().limits.timeout;
        let late: Vec<&str> = self
            .calls
            .all
            .iter()
            .filter(|c| c.timed_out)
            .map(|c| c.op)
            .collect();
        if !late.is_empty() {
            return Err(format!(
                "{} exceeded the time limit of {limit:?}",
                late.join(", ")
            ));
        }
        let slowest = self.calls.all.iter().max_by_key(|c| c.elapsed);
        Ok(slowest.map_or_else(
            || "no calls".to_owned(),
            |c| {
                format!(
                    "slowest: {} in {}ms of the {limit:?} limit",
                    c.op,
                    c.elapsed.as_millis()
                )
            },
        ))
    }
}
