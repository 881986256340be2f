//! Kubernetes Events about vmop's objects, published best effort: an Event that cannot be
//! written is logged and never fails a reconcile.
//!
//! # Guarantees
//!
//! - Repeats of the same Event (same object, type, reason, action *and* note) within
//!   [`SERIES_WINDOW`] are folded into one Event with a growing `series.count` (one PATCH, not a
//!   new object). kube's `Recorder` folds by reason and action only and keeps the first note,
//!   so "is Stopped (was Running)" would show as a repeat of "is Running (was Provisioning)".
//! - Every Event name is a valid name of at most 253 characters, whatever the length of the
//!   object's name (kube's `Recorder` appends 17 characters to it, so no Event could be written
//!   for a 253-character VM name; tests: `event_names_fit_for_the_longest_object_names`, and
//!   `long_names_get_events` on the real operator).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Lookup;
use kube::{Client, Resource};
use vmop_contract::text::{cut, truncate};

/// `reportingController` of every Event vmop writes.
pub const REPORTER: &str = "vmop.dev/operator";

/// How long repeats keep folding into one series (kube's cache TTL).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// The longest object name: a DNS subdomain.
const MAX_NAME: usize = 253;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Publishes Events; cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    client: Client,
    instance: String,
    series: Arc<Mutex<HashMap<SeriesKey, Series>>>,
}

/// What makes two Events the same series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    uid: String,
    type_: EventType,
    reason: String,
    action: String,
    note: String,
}

#[derive(Debug, Clone)]
struct Series {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").finish_non_exhaustive()
    }
}

impl EventSink {
    /// `instance` distinguishes replicas (the pod name); `None` uses the host name.
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let instance = instance
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| REPORTER.to_owned());
        EventSink {
            client,
            instance,
            series: Arc::default(),
        }
    }

    pub async fn normal<K>(&self, obj: &K, action: &str, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        self.publish(obj, EventType::Normal, action, reason, note.into())
            .await;
    }

    pub async fn warning<K>(&self, obj: &K, action: &str, reason: &str, note: impl Into<String>)
    where
        K: Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        self.publish(obj, EventType::Warning, action, reason, note.into())
            .await;
    }

    async fn publish<K>(&self, obj: &K, type_: EventType, action: &str, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    {
        let reference = obj.object_ref(&());
        let note = truncate(note, 1024);
        let key = SeriesKey {
            uid: reference.uid.clone().unwrap_or_default(),
            type_,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.clone(),
        };
        let result = match self.repeat(&key) {
            Some(series) => self.bump(&series).await,
            None => self.create(&reference, key, note).await,
        };
        if let Err(error) = result {
            tracing::warn!(
                error = %chain(&error),
                reason,
                object = reference.name.as_deref().unwrap_or_default(),
                "failed to publish an Event"
            );
        }
    }

    /// The live series `key` continues, counted one more.
    fn repeat(&self, key: &SeriesKey) -> Option<Series> {
        let now = Instant::now();
        let mut all = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
        let series = all.get_mut(key)?;
        series.count = series.count.saturating_add(1);
        series.last = now;
        Some(series.clone())
    }

    async fn bump(&self, series: &Series) -> Result<(), kube::Error> {
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &series.namespace);
        let patch = EventSeries {
            count: series.count,
            last_observed_time: MicroTime(Timestamp::now()),
        };
        api.patch(
            &series.name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "series": patch })),
        )
        .await
        .map(drop)
    }

    async fn create(
        &self,
        reference: &ObjectReference,
        key: SeriesKey,
        note: String,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let namespace = reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = event_name(
            reference.name.as_deref().unwrap_or(REPORTER),
            now.as_nanosecond(),
        );
        let event = K8sEvent {
            action: Some(key.action.clone()),
            reason: Some(key.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(REPORTER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(key.type_.as_str().to_owned()),
            ..K8sEvent::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        self.series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key,
                Series {
                    namespace,
                    name,
                    count: 1,
                    last: Instant::now(),
                },
            );
        Ok(())
    }
}

/// `<object>.<hex time>`, the object's name cut so that the whole fits in [`MAX_NAME`] and
/// still ends in an alphanumeric character.
fn event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{:x}", nanos.unsigned_abs());
    let room = MAX_NAME.saturating_sub(suffix.len());
    let stem = cut(object, room).trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{stem}{suffix}")
}

pub use vmop_runtime::chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_fit_for_the_longest_object_names() {
        let longest = format!("{}-x", "a".repeat(251));
        assert_eq!(longest.len(), 253);
        let name = event_name(&longest, i128::MAX);
        assert!(name.len() <= MAX_NAME, "{} characters", name.len());
        let cut_at_dash = format!("{}-{}", "a".repeat(220), "b".repeat(32));
        let name = event_name(&cut_at_dash, 1);
        assert!(name.len() <= MAX_NAME);
        assert!(
            !name.contains("-."),
            "the stem must end alphanumeric: {name}"
        );
        assert_eq!(event_name("web", 255), "web.ff");
    }
}
