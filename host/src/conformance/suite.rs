//! [`Suite`]: one run's state (calls, report, what to clean up), the order of the checks,
//! and the helpers they share. The checks are in `lifecycle.rs` (the machine's life),
//! `classes.rs` (error classes) and `cleanup.rs` (cleanup and the whole-run verdicts).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use super::Options;
use super::calls::{Calls, describe};
use super::report::{Outcome, Report};
use vmop_runtime::Plugin;
use vmop_runtime::WIT_VERSION;
use vmop_runtime::registry::PluginRegistry;
use vmop_runtime::sandbox::{CallContext, CallError};
use vmop_runtime::types::{VmSpec, VmStatus};

/// What a check concluded: a reason to pass with, or one to fail with.
pub(super) type Verdict = Result<String, String>;

/// One run: the plugin's calls, the report so far, and what must be cleaned up.
pub(super) struct Suite<'a> {
    pub(super) options: &'a Options,
    pub(super) uid: String,
    pub(super) calls: Calls,
    pub(super) report: Report,
    /// Every id a `create` answered, and the uids used: cleanup deletes them all.
    pub(super) created: BTreeSet<String>,
    pub(super) uids: Vec<String>,
    /// Ids whose `delete` succeeded (cleanup leaves them alone).
    pub(super) deleted: BTreeSet<String>,
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

    pub(super) async fn checks(&mut self, plugin: &Plugin) {
        self.location(plugin).await;
        self.find_before_create(plugin).await;
        self.get_unknown(plugin).await;
        match self.create(plugin).await {
            Some(id) => {
                self.create_idempotent(plugin, &id).await;
                self.find_after_create(plugin, &id).await;
                self.get_after_create(plugin, &id).await;
                self.list_after_create(plugin, &id).await;
                self.delete(plugin, &id).await;
                self.delete_again(plugin, &id).await;
                self.delete_unknown(plugin).await;
                self.gone_after_delete(plugin, &id).await;
                self.list_after_delete(plugin, &id).await;
            }
            None => {
                for name in [
                    "create-idempotent",
                    "find-after-create",
                    "get-after-create",
                    "list-after-create",
                    "delete",
                    "delete-again",
                ] {
                    self.skip(name, "create made no machine");
                }
                self.delete_unknown(plugin).await;
                self.skip("gone-after-delete", "create made no machine");
                self.skip("list-after-delete", "create made no machine");
            }
        }
        self.refused_credential(plugin).await;
        self.impossible_spec(plugin).await;
    }

    pub(super) fn ctx(&self) -> &'a CallContext {
        &self.options.ctx
    }

    pub(super) fn spec(&self, uid: &str, image: &str) -> VmSpec {
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

    pub(super) fn unknown_id(&self) -> String {
        format!("vmop-conformance-missing-{}", self.uid)
    }

    pub(super) fn record(&mut self, name: &'static str, mark: usize, verdict: Verdict) {
        let (outcome, reason) = match verdict {
            Ok(reason) => (Outcome::Pass, reason),
            Err(reason) => (Outcome::Fail, reason),
        };
        let elapsed = self.calls.elapsed_since(mark);
        self.report.push(name, outcome, reason, elapsed);
    }

    pub(super) fn skip(&mut self, name: &'static str, reason: &str) {
        self.report
            .push(name, Outcome::Skip, reason.to_owned(), Duration::ZERO);
    }

    /// `get(id)` until it answers `present` (some or none), an error, or the grace period ends;
    /// returns the last answer and how long it took.
    pub(super) async fn get_until(
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
    pub(super) async fn find_until(
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

    pub(super) fn grace_over(&self, started: Instant) -> bool {
        started.elapsed() >= self.options.grace
    }
}

pub(super) fn status_text(s: &VmStatus) -> String {
    format!("{} {} [{}]", s.id, s.phase.as_str(), s.addresses.join(", "))
}
