//! Kubernetes Events about vmop's objects, published best effort: an Event that cannot be
//! written is logged and never fails a reconcile.

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Lookup;
use kube::{Client, Resource};

/// `reportingController` of every Event vmop writes.
pub const REPORTER: &str = "vmop.dev/operator";

/// Publishes Events; cheap to clone. Repeats of the same Event within a few minutes are folded
/// into one Event with a growing `series.count` by kube's [`Recorder`].
#[derive(Clone)]
pub struct EventSink {
    recorder: Recorder,
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
            recorder: Recorder::new(client, reporter),
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
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(
                error = %chain(&error),
                reason,
                object = reference.name.as_deref().unwrap_or_default(),
                "failed to publish an Event"
            );
        }
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
