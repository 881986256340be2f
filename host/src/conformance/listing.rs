//! The checks of `list` (capability `list`; skipped without it): a listing that ends, names
//! every machine once, agrees with `get`, carries the run's cluster mark, tolerates a machine
//! created between its pages, and forgets a deleted machine.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::calls::describe;
use super::suite::Suite;
use vmop_runtime::Plugin;
use vmop_runtime::types::ListedMachine;

/// Pages one listing of the run may take before the check says it never ends.
const MAX_PAGES: usize = 1000;

/// A listing of the run: every machine, in the order answered.
struct Listed {
    machines: Vec<ListedMachine>,
    pages: usize,
}

impl Suite<'_> {
    fn lists(plugin: &Plugin) -> bool {
        plugin.info().has("list")
    }

    /// Pages through `list`; `between` runs once after the first page when more follow.
    async fn list_all(
        &mut self,
        plugin: &Plugin,
        mut between: Option<&str>,
    ) -> Result<Listed, String> {
        let mut machines = Vec::new();
        let mut cursors = BTreeSet::new();
        let mut cursor: Option<String> = None;
        for pages in 1..=MAX_PAGES {
            let page = self
                .calls
                .run("list", plugin.list(self.ctx(), cursor.as_deref()))
                .await
                .map_err(|e| format!("page {pages}: {}", describe(&e)))?;
            machines.extend(page.machines);
            match page.next {
                None => return Ok(Listed { machines, pages }),
                Some(next) if !cursors.insert(next.clone()) => {
                    return Err(format!(
                        "page {pages} answered cursor `{next}` again: it never ends"
                    ));
                }
                Some(next) => cursor = Some(next),
            }
            if let Some(uid) = between.take() {
                let spec = self.spec(uid, &self.options.image);
                match self
                    .calls
                    .run("create", plugin.create(self.ctx(), &spec))
                    .await
                {
                    Ok(made) => {
                        self.created.insert(made.id);
                    }
                    Err(e) => return Err(format!("create between pages: {}", describe(&e))),
                }
            }
        }
        Err(format!("the listing did not end within {MAX_PAGES} pages"))
    }

    /// `list` until `id` is in it (`present`) or not, or the grace period ends.
    async fn list_until(
        &mut self,
        plugin: &Plugin,
        id: &str,
        present: bool,
        between: Option<&str>,
    ) -> Result<(Listed, Duration), String> {
        let started = Instant::now();
        let mut between = between;
        loop {
            let listed = self.list_all(plugin, between.take()).await?;
            let has = listed.machines.iter().any(|m| m.status.id == id);
            if has == present || self.grace_over(started) {
                return Ok((listed, started.elapsed()));
            }
            tokio::time::sleep(self.options.poll_interval).await;
        }
    }

    /// `list-after-create`: the created machine is listed once, as `get` sees it, with the
    /// run's cluster mark; no machine is listed twice, even one created between two pages.
    pub(super) async fn list_after_create(&mut self, plugin: &Plugin, id: &str) {
        if !Self::lists(plugin) {
            return self.skip("list-after-create", "the plugin does not declare `list`");
        }
        let mark = self.calls.all.len();
        let between = format!("{}-between", self.uid);
        self.uids.push(between.clone());
        let verdict = match self.list_until(plugin, id, true, Some(&between)).await {
            Err(reason) => Err(reason),
            Ok((listed, waited)) => self.judge_listing(plugin, id, &listed, waited).await,
        };
        self.record("list-after-create", mark, verdict);
    }

    async fn judge_listing(
        &mut self,
        plugin: &Plugin,
        id: &str,
        listed: &Listed,
        waited: Duration,
    ) -> Result<String, String> {
        let mut seen = BTreeSet::new();
        if let Some(twice) = listed
            .machines
            .iter()
            .find(|m| !seen.insert(m.status.id.clone()))
        {
            return Err(format!("machine {} listed twice", twice.status.id));
        }
        let Some(mine) = listed.machines.iter().find(|m| m.status.id == id) else {
            return Err(format!("machine {id} not listed within {waited:?}"));
        };
        let cluster = &self.ctx().settings.cluster;
        if mine.cluster.as_deref() != Some(cluster.as_str()) {
            return Err(format!(
                "machine {id} listed with cluster {:?}, not the config's `{cluster}`",
                mine.cluster
            ));
        }
        if let Some(other) = listed
            .machines
            .iter()
            .find(|m| m.cluster.as_deref() != Some(cluster.as_str()))
        {
            return Err(format!(
                "machine {} of cluster {:?} listed for cluster `{cluster}`",
                other.status.id, other.cluster
            ));
        }
        let got = self.calls.run("get", plugin.get(self.ctx(), id)).await;
        match got {
            Ok(Some(g)) if g.owner == mine.status.owner && g.phase == mine.status.phase => {}
            Ok(g) => {
                return Err(format!(
                    "listed as {:?} owned by {:?}, but get answers {g:?}",
                    mine.status.phase, mine.status.owner
                ));
            }
            Err(e) => return Err(describe(&e)),
        }
        if mine.status.owner.as_deref() != Some(self.uid.as_str()) {
            return Err(format!(
                "machine {id} listed with owner {:?}, not {}",
                mine.status.owner, self.uid
            ));
        }
        Ok(format!(
            "{} machine(s) in {} page(s), {id} once, as get sees it{}",
            listed.machines.len(),
            listed.pages,
            mine.created_at_ms.map_or_else(
                || ", no creation time".to_owned(),
                |_| ", with its creation time".to_owned()
            )
        ))
    }

    /// `list-after-delete`: the deleted machine leaves the listing (polled within the grace
    /// period).
    pub(super) async fn list_after_delete(&mut self, plugin: &Plugin, id: &str) {
        if !Self::lists(plugin) {
            return self.skip("list-after-delete", "the plugin does not declare `list`");
        }
        let mark = self.calls.all.len();
        let verdict = match self.list_until(plugin, id, false, None).await {
            Err(reason) => Err(reason),
            Ok((listed, waited)) if listed.machines.iter().any(|m| m.status.id == id) => Err(
                format!("deleted machine {id} still listed after {waited:?}"),
            ),
            Ok((listed, _)) => Ok(format!("{id} gone from {} page(s)", listed.pages)),
        };
        self.record("list-after-delete", mark, verdict);
    }
}
