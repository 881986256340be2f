//! Kubernetes Events about vmop's objects, published best effort: an Event that cannot be
//! written is logged and never fails a reconcile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Lookup;
use kube::{Client, Resource};

/// `reportingController` of every Event vmop writes.
pub const REPORTER: &str = "vmop.dev/operator";

/// How long a [`Recorder`] keeps folding repeats into a series (kube's cache TTL).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Publishes Events; cheap to clone.
///
/// Repeats of the same Event (same object, reason, action *and* note) within a few minutes are
/// folded into one Event with a growing `series.count`. kube's [`Recorder`] alone folds by
/// reason and action only and keeps the first note, so "is Stopped (was Running)" would show
/// as a repeat of "is Running (was Provisioning)": one Recorder per distinct note avoids that.
#[derive(Clone)]
pub struct EventSink {
    client: Client,
    reporter: Reporter,
    recorders: Arc<Mutex<HashMap<SeriesKey, (Recorder, Instant)>>>,
}

/// What makes two Events the same series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    uid: String,
    reason: String,
    action: String,
    note: String,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").finish_non_exhaustive()
    }
}

impl EventSink {
    /// `instance` distinguishes replicas (the pod name); `None` uses the host name.
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: REPORTER.to_owned(),
            instance,
        };
        EventSink {
            client,
            reporter,
            recorders: Arc::default(),
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
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1024)),
            action: action.to_owned(),
            secondary: None,
        };
        let reference = obj.object_ref(&());
        let key = SeriesKey {
            uid: reference.uid.clone().unwrap_or_default(),
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone().unwrap_or_default(),
        };
        let recorder = self.recorder_for(key);
        if let Err(error) = recorder.publish(&event, &reference).await {
            tracing::warn!(
                error = %chain(&error),
                reason,
                object = reference.name.as_deref().unwrap_or_default(),
                "failed to publish an Event"
            );
        }
    }
}

impl EventSink {
    /// The Recorder of one series, new if the series is new or has expired.
    fn recorder_for(&self, key: SeriesKey) -> Recorder {
        let now = Instant::now();
        let mut recorders = self
            .recorders
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        recorders.retain(|_, (_, used)| now.duration_since(*used) < SERIES_WINDOW);
        let (recorder, used) = recorders.entry(key).or_insert_with(|| {
            (
                Recorder::new(self.client.clone(), self.reporter.clone()),
                now,
            )
        });
        *used = now;
        recorder.clone()
    }
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

/// Cuts `s` to at most `max` bytes on a character boundary (Event notes are limited to 1 kB).
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner {0}")]
    struct Inner(u8);

    #[test]
    fn chain_joins_causes() {
        assert_eq!(chain(&Outer(Inner(7))), "outer: inner 7");
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc".into(), 10), "abc");
        let s = truncate("é".repeat(10), 8);
        assert!(s.len() <= 8 && s.ends_with("..."), "{s}");
    }
}
