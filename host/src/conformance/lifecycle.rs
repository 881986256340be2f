//! The checks of the machine's life: location, find/get before and after create, create
//! twice, delete twice, gone after delete.

use super::calls::describe;
use super::suite::{Suite, status_text};
use vmop_runtime::Plugin;

impl Suite<'_> {
    pub(super) async fn location(&mut self, plugin: &Plugin) {
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

    pub(super) async fn find_before_create(&mut self, plugin: &Plugin) {
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

    pub(super) async fn get_unknown(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let id = self.unknown_id();
        let verdict = match self.calls.run("get", plugin.get(self.ctx(), &id)).await {
            Ok(None) => Ok(format!("none for `{id}`")),
            Ok(Some(s)) => Err(format!("answered machine {} for unknown id `{id}`", s.id)),
            Err(e) => Err(format!("must answer none, not fail: {}", describe(&e))),
        };
        self.record("get-unknown", mark, verdict);
    }

    pub(super) async fn create(&mut self, plugin: &Plugin) -> Option<String> {
        let mark = self.calls.all.len();
        let spec = self.spec(&self.uid, &self.options.image);
        let result = self
            .calls
            .run("create", plugin.create(self.ctx(), &spec))
            .await;
        let (verdict, id) = match result {
            // A machine made for a uid is that uid's: the host refuses to act on one marked as
            // another VM's (`vm-status.owner`).
            Ok(s) if s.owned_by_other(&self.uid) => {
                self.created.insert(s.id.clone());
                let verdict = Err(format!(
                    "answered machine {} with owner {:?}, not the spec's uid {}",
                    s.id, s.owner, self.uid
                ));
                (verdict, Some(s.id))
            }
            Ok(s) => {
                self.created.insert(s.id.clone());
                (Ok(status_text(&s)), Some(s.id))
            }
            Err(e) => (Err(describe(&e)), None),
        };
        self.record("create", mark, verdict);
        id
    }

    pub(super) async fn create_idempotent(&mut self, plugin: &Plugin, id: &str) {
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

    pub(super) async fn find_after_create(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let uid = self.uid.clone();
        let (result, waited) = self.find_until(plugin, &uid, true).await;
        let verdict = match result {
            Ok(Some(s)) if s.owned_by_other(&uid) => Err(format!(
                "answered {} with owner {:?}, not the uid {uid} it was found by",
                s.id, s.owner
            )),
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

    pub(super) async fn get_after_create(&mut self, plugin: &Plugin, id: &str) {
        let mark = self.calls.all.len();
        let (result, waited) = self.get_until(plugin, id, true).await;
        let asked = self.calls.all.len() - mark;
        let verdict = match result {
            Ok(Some(_)) if asked > 1 && plugin.info().has("consistent-get") => Err(format!(
                "declares consistent-get, but get of {id} answered none {} time(s) after create",
                asked - 1
            )),
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

    pub(super) async fn delete(&mut self, plugin: &Plugin, id: &str) {
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

    pub(super) async fn delete_again(&mut self, plugin: &Plugin, id: &str) {
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

    pub(super) async fn delete_unknown(&mut self, plugin: &Plugin) {
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

    pub(super) async fn gone_after_delete(&mut self, plugin: &Plugin, id: &str) {
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
}
