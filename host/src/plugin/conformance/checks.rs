//! The checks themselves, in the order of [`super::CHECKS`], and the cleanup after them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use super::calls::{Calls, describe};
use super::report::{Outcome, Report};
use super::{Options, is_unauthorized};
use crate::plugin::bindings::WIT_VERSION;
use crate::plugin::component::Plugin;
use crate::plugin::registry::PluginRegistry;
use crate::plugin::sandbox::{CallContext, CallError};
use crate::plugin::types::{ErrorClass, ProviderError, VmSpec, VmStatus};

/// What a check concluded: a reason to pass with, or one to fail with.
type Verdict = Result<String, String>;

/// One run: the plugin's calls, the report so far, and what must be cleaned up.
pub(super) struct Suite<'a> {
    options: &'a Options,
    uid: String,
    calls: Calls,
    report: Report,
    /// Every id a `create` answered, and the uids used: cleanup deletes them all.
    created: BTreeSet<String>,
    uids: Vec<String>,
    /// Ids whose `delete` succeeded (cleanup leaves them alone).
    deleted: BTreeSet<String>,
}

impl<'a> Suite<'a> {
    pub fn new(options: &'a Options, uid: String) -> Self {
        Suite {
            options,
            uids: vec![uid.clone()],
            uid,
            calls: Calls::default(),
            report: Report::default(),
            created: BTreeSet::new(),
            deleted: BTreeSet::new(),
        }
    }

    pub async fn run(mut self, registry: &PluginRegistry, path: &Path) -> Report {
        let started = Instant::now();
        let plugin = match registry.load(path, None).await {
            Ok(plugin) => plugin,
            Err(e) => {
                let reason = describe(&e);
                self.report
                    .push("info", Outcome::Fail, reason, started.elapsed());
                for name in super::CHECKS.iter().skip(1) {
                    self.skip(name, "the plugin did not load");
                }
                return self.report;
            }
        };
        let info = plugin.info();
        let reason = format!(
            "{} {}, WIT {} (host {WIT_VERSION}), capabilities [{}]",
            info.name,
            info.version,
            info.wit_version,
            info.capabilities.join(", ")
        );
        self.report
            .push("info", Outcome::Pass, reason, started.elapsed());
        self.checks(&plugin).await;
        self.cleanup(&plugin).await;
        self.report
    }

    async fn checks(&mut self, plugin: &Plugin) {
        self.location(plugin).await;
        self.find_before_create(plugin).await;
        self.get_unknown(plugin).await;
        match self.create(plugin).await {
            Some(id) => {
                self.create_idempotent(plugin, &id).await;
                self.find_after_create(plugin, &id).await;
                self.get_after_create(plugin, &id).await;
                self.delete(plugin, &id).await;
                self.delete_again(plugin, &id).await;
                self.delete_unknown(plugin).await;
                self.gone_after_delete(plugin, &id).await;
            }
            None => {
                for name in [
                    "create-idempotent",
                    "find-after-create",
                    "get-after-create",
                    "delete",
                    "delete-again",
                ] {
                    self.skip(name, "create made no machine");
                }
                self.delete_unknown(plugin).await;
                self.skip("gone-after-delete", "create made no machine");
            }
        }
        self.refused_credential(plugin).await;
        self.impossible_spec(plugin).await;
    }

    fn ctx(&self) -> &'a CallContext {
        &self.options.ctx
    }

    fn spec(&self, uid: &str, image: &str) -> VmSpec {
        VmSpec {
            name: "vmop-conformance".to_owned(),
            namespace: "vmop-conformance".to_owned(),
            uid: uid.to_owned(),
            image: image.to_owned(),
            cpu: self.options.cpu,
            memory_mib: self.options.memory_mib,
            user_data: None,
            labels: BTreeMap::from([("vmop.dev/conformance".to_owned(), "true".to_owned())]),
            parameters: BTreeMap::new(),
        }
    }

    fn unknown_id(&self) -> String {
        format!("vmop-conformance-missing-{}", self.uid)
    }

    fn record(&mut self, name: &'static str, mark: usize, verdict: Verdict) {
        let (outcome, reason) = match verdict {
            Ok(reason) => (Outcome::Pass, reason),
            Err(reason) => (Outcome::Fail, reason),
        };
        let elapsed = self.calls.elapsed_since(mark);
        self.report.push(name, outcome, reason, elapsed);
    }

    fn skip(&mut self, name: &'static str, reason: &str) {
        self.report
            .push(name, Outcome::Skip, reason.to_owned(), Duration::ZERO);
    }

    async fn location(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let first = self
            .calls
            .run("location", plugin.location(self.ctx()))
            .await;
        let second = self
            .calls
            .run("location", plugin.location(self.ctx()))
            .await;
        let verdict = match (first, second) {
            (Ok(a), Ok(b)) if a == b => Ok(format!("`{a}`, stable")),
            (Ok(a), Ok(b)) => Err(format!("changed between two calls: `{a}`, then `{b}`")),
            (Err(e), _) | (_, Err(e)) => Err(describe(&e)),
        };
        self.record("location", mark, verdict);
    }

    async fn find_before_create(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let verdict = match self
            .calls
            .run("find", plugin.find(self.ctx(), &self.uid))
            .await
        {
            Ok(None) => Ok(format!("none for the fresh uid {}", self.uid)),
            Ok(Some(s)) => {
                self.created.insert(s.id.clone());
                Err(format!(
                    "answered machine {} for a uid nothing was created for",
                    s.id
                ))
            }
            Err(e) => Err(describe(&e)),
        };
        self.record("find-before-create", mark, verdict);
    }

    async fn get_unknown(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let id = self.unknown_id();
        let verdict = match self.calls.run("get", plugin.get(self.ctx(), &id)).await {
            Ok(None) => Ok(format!("none for `{id}`")),
            Ok(Some(s)) => Err(format!("answered machine {} for unknown id `{id}`", s.id)),
            Err(e) => Err(format!("must answer none, not fail: {}", describe(&e))),
        };
        self.record("get-unknown", mark, verdict);
    }

    async fn create(&mut self, plugin: &Plugin) -> Option<String> {
        let mark = self.calls.all.len();
        let spec = self.spec(&self.uid, &self.options.image);
        let result = self
            .calls
            .run("create", plugin.create(self.ctx(), &spec))
            .await;
        let (verdict, id) = match result {
            Ok(s) => {
                self.created.insert(s.id.clone());
                (Ok(status_text(&s)), Some(s.id))
            }
            Err(e) => (Err(describe(&e)), None),
        };
        self.record("create", mark, verdict);
        id
    }

    async fn create_idempotent(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let spec = self.spec(&self.uid, &self.options.image);
        let result = self
            .calls
            .run("create", plugin.create(self.ctx(), &spec))
            .await;
        let verdict = match result {
            Ok(s) if s.id == id => Ok(format!("the second create answered the same {id}")),
            Ok(s) => {
                self.created.insert(s.id.clone());
                Err(format!(
                    "the second create with uid {} answered {}, the first {id}: two machines",
                    self.uid, s.id
                ))
            }
            Err(e) => Err(format!("the second create failed: {}", describe(&e))),
        };
        self.record("create-idempotent", mark, verdict);
    }

    async fn find_after_create(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let uid = self.uid.clone();
        let (result, waited) = self.find_until(plugin, &uid, true).await;
        let verdict = match result {
            Ok(Some(s)) if s.id == id => Ok(format!("{id} after {}ms", waited.as_millis())),
            Ok(Some(s)) => Err(format!("answered {}, create answered {id}", s.id)),
            Ok(None) => Err(format!(
                "none within the grace period of {:?}",
                self.options.grace
            )),
            Err(e) => Err(describe(&e)),
        };
        self.record("find-after-create", mark, verdict);
    }

    async fn get_after_create(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let (result, waited) = self.get_until(plugin, id, true).await;
        let verdict = match result {
            Ok(Some(s)) if s.id == id => Ok(format!(
                "{} after {}ms",
                status_text(&s),
                waited.as_millis()
            )),
            Ok(Some(s)) => Err(format!("get of {id} answered machine {}", s.id)),
            Ok(None) => Err(format!(
                "none for {id} within the grace period of {:?}",
                self.options.grace
            )),
            Err(e) => Err(describe(&e)),
        };
        self.record("get-after-create", mark, verdict);
    }

    async fn delete(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let verdict = match self
            .calls
            .run("delete", plugin.delete(self.ctx(), id))
            .await
        {
            Ok(()) => {
                self.deleted.insert(id.to_owned());
                Ok(format!("{id} deleted"))
            }
            Err(e) => Err(describe(&e)),
        };
        self.record("delete", mark, verdict);
    }

    async fn delete_again(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let verdict = match self
            .calls
            .run("delete", plugin.delete(self.ctx(), id))
            .await
        {
            Ok(()) => Ok(format!("deleting {id} again succeeded")),
            Err(e) => Err(format!(
                "deleting the deleted {id} must succeed: {}",
                describe(&e)
            )),
        };
        self.record("delete-again", mark, verdict);
    }

    async fn delete_unknown(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let id = self.unknown_id();
        let verdict = match self
            .calls
            .run("delete", plugin.delete(self.ctx(), &id))
            .await
        {
            Ok(()) => Ok(format!("deleting `{id}` succeeded")),
            Err(e) => Err(format!(
                "deleting a machine that does not exist must succeed: {}",
                describe(&e)
            )),
        };
        self.record("delete-unknown", mark, verdict);
    }

    async fn gone_after_delete(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let uid = self.uid.clone();
        let (got, get_waited) = self.get_until(plugin, id, false).await;
        let (found, find_waited) = self.find_until(plugin, &uid, false).await;
        let verdict = match (got, found) {
            (Ok(None), Ok(None)) => Ok(format!(
                "get and find answer none after {}ms",
                get_waited.max(find_waited).as_millis()
            )),
            (Ok(Some(_)), _) => Err(format!(
                "get still answers {id} after the grace period of {:?}",
                self.options.grace
            )),
            (_, Ok(Some(s))) => Err(format!(
                "find still answers {} after the grace period of {:?}",
                s.id, self.options.grace
            )),
            (Err(e), _) | (_, Err(e)) => Err(describe(&e)),
        };
        self.record("gone-after-delete", mark, verdict);
    }

    async fn refused_credential(&mut self, plugin: &Plugin) {
        let secrets = &self.ctx().settings.secrets;
        if secrets.is_empty() {
            return self.skip(
                "refused-credential",
                "no secrets given (--secrets-file): there is no credential to falsify",
            );
        }
        let mut ctx = self.ctx().clone();
        for value in ctx.settings.secrets.values_mut() {
            *value = format!("vmop-conformance-bogus-{}", value.len());
        }
        let mark = self.calls.all.len();
        let result = self.calls.run("find", plugin.find(&ctx, &self.uid)).await;
        let verdict = match result {
            Err(e) if is_unauthorized(&e) => Ok(describe(&e)),
            Ok(_) => {
                return self.skip(
                    "refused-credential",
                    "the backend accepted falsified secrets (it checks no credentials), so \
                     the `unauthorized` class cannot be shown against it",
                );
            }
            Err(e) => Err(format!(
                "falsified secrets answered {}, not unauthorized: {}",
                class_name(&e),
                describe(&e)
            )),
        };
        self.record("refused-credential", mark, verdict);
    }

    async fn impossible_spec(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let uid = format!("{}-impossible", self.uid);
        self.uids.push(uid.clone());
        let spec = self.spec(&uid, &self.options.impossible_image);
        let result = self
            .calls
            .run("create", plugin.create(self.ctx(), &spec))
            .await;
        let image = &self.options.impossible_image;
        let verdict = match result {
            Err(CallError::Provider(e @ ProviderError::InvalidSpec(_))) => Ok(e.to_string()),
            Ok(s) => {
                self.created.insert(s.id.clone());
                Err(format!("create with image `{image}` made machine {}", s.id))
            }
            Err(e) => Err(format!(
                "create with image `{image}` answered {}, not invalid-spec: {}",
                class_name(&e),
                describe(&e)
            )),
        };
        self.record("impossible-spec", mark, verdict);
    }

    /// Deletes what the run made, then judges the calls of the whole run.
    async fn cleanup(&mut self, plugin: &Plugin) {
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

    fn bounds_verdict(&self) -> Verdict {
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

    fn time_verdict(&self) -> Verdict {
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

    /// `get(id)` until it answers `present` (some or none), an error, or the grace period ends;
    /// returns the last answer and how long it took.
    async fn get_until(
        &mut self,
        plugin: &Plugin,
        id: &str,
        present: bool,
    ) -> (Result<Option<VmStatus>, CallError>, Duration) {
        let started = Instant::now();
        loop {
            let result = self.calls.run("get", plugin.get(self.ctx(), id)).await;
            if !matches!(&result, Ok(s) if s.is_some() != present) || self.grace_over(started) {
                return (result, started.elapsed());
            }
            tokio::time::sleep(self.options.poll_interval).await;
        }
    }

    /// `find(uid)`, polled like [`Suite::get_until`].
    async fn find_until(
        &mut self,
        plugin: &Plugin,
        uid: &str,
        present: bool,
    ) -> (Result<Option<VmStatus>, CallError>, Duration) {
        let started = Instant::now();
        loop {
            let result = self.calls.run("find", plugin.find(self.ctx(), uid)).await;
            if !matches!(&result, Ok(s) if s.is_some() != present) || self.grace_over(started) {
                return (result, started.elapsed());
            }
            tokio::time::sleep(self.options.poll_interval).await;
        }
    }

    fn grace_over(&self, started: Instant) -> bool {
        started.elapsed() >= self.options.grace
    }
}

fn status_text(s: &VmStatus) -> String {
    format!("{} {} [{}]", s.id, s.phase.as_str(), s.addresses.join(", "))
}

/// The error class as the contract spells it (a plugin fault has none: it says what it was).
fn class_name(e: &CallError) -> &'static str {
    match e {
        CallError::Provider(p) => match ErrorClass::from(p) {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimited(_) => "rate-limited",
            ErrorClass::Permanent => "permanent",
            ErrorClass::InvalidSpec => "invalid-spec",
            ErrorClass::Unauthorized => "unauthorized",
        },
        CallError::Trap { .. } => "a trap",
        CallError::Timeout { .. } => "a timeout",
        CallError::MemoryLimit { .. } => "the memory cap",
        CallError::ContractViolation { .. } => "a contract violation",
        CallError::Instantiate { .. } => "a host failure to instantiate",
    }
}
