//! [`Redactor`]: replaces every Secret value the host holds for a ProviderConfig by
//! `[redacted]` in text a plugin produced, before that text leaves the host.
//!
//! # Guarantees
//!
//! - Every value of at least [`MIN_REDACTED_LEN`] bytes is replaced wherever it occurs, longer
//!   values first, so a value that contains another is replaced whole
//!   (`redact::tests::longest_value_wins`).
//! - The plugin runtime applies it to `log` lines, captured stdout/stderr and to the text of
//!   everything a call returns, answer and error (`redaction::echoed_secrets_reach_no_log_line_and_no_status`,
//!   `redaction::echoed_secret_in_an_error_reaches_no_log_line`,
//!   `exfiltrate::the_redactor_removes_an_echoed_secret_from_the_error`).
//! - Identity is never rewritten: a machine's `id`, its `owner` mark and a `location` are
//!   passed as the plugin said them (`redact::tests::identity_is_never_rewritten`). A rewritten
//!   id would have deletion ask for a machine that does not exist, so the VM's finalizer would
//!   stick or, with `consistent-get`, the machine would leak; two accounts whose ids are Secret
//!   values would share one rewritten location, defeating the location guard.
//!
//! # Caveats
//!
//! - Values shorter than [`MIN_REDACTED_LEN`] are not replaced: they are too short to be a
//!   credential, and replacing them would garble every message (a Secret holding `us` would
//!   redact every `us`).
//! - Only the literal value is found. A plugin that holds a secret (`passthrough` mode) and
//!   wants to leak it can encode it first, or put it in an identity field; redaction protects
//!   against accidents, not against a hostile plugin that was handed the secret. Under
//!   host-side signing the plugin never holds one.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use super::types::{ProviderError, VmStatus};

/// The replacement text.
pub const REDACTED: &str = "[redacted]";
/// Shorter values are left alone (see the module docs).
pub const MIN_REDACTED_LEN: usize = 4;

/// The Secret values of one ProviderConfig. Cheap to clone; `Debug` shows only how many.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first.
    values: Arc<[String]>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("values", &self.values.len())
            .finish()
    }
}

impl Redactor {
    /// Redacts `values` (values shorter than [`MIN_REDACTED_LEN`] are dropped).
    pub fn new<I, S>(values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut values: Vec<String> = values
            .into_iter()
            .map(Into::into)
            .filter(|v| v.len() >= MIN_REDACTED_LEN)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Redactor {
            values: values.into(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The length of the longest value: text cut at a bound must keep this much beyond it
    /// until redacted, or a value straddling the cut would survive in part.
    pub fn max_len(&self) -> usize {
        self.values.first().map_or(0, String::len)
    }

    /// `text` with every value replaced; borrowed when nothing matched.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for value in self.values.iter() {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), REDACTED));
            }
        }
        out
    }

    /// Owned variant of [`Redactor::text`].
    pub fn string(&self, text: String) -> String {
        match self.text(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(redacted) => redacted,
        }
    }

    /// Every message of a provider error.
    pub fn provider_error(&self, error: ProviderError) -> ProviderError {
        match error {
            ProviderError::Transient(m) => ProviderError::Transient(self.string(m)),
            ProviderError::RateLimited {
                retry_after,
                message,
            } => ProviderError::RateLimited {
                retry_after,
                message: self.string(message),
            },
            ProviderError::Permanent(m) => ProviderError::Permanent(self.string(m)),
            ProviderError::InvalidSpec(m) => ProviderError::InvalidSpec(self.string(m)),
            ProviderError::Unauthorized(m) => ProviderError::Unauthorized(self.string(m)),
        }
    }

    /// The text of a status the plugin reported (its message and addresses); its identity
    /// (`id`, `owner`) as it is (see the module docs).
    pub fn status(&self, status: VmStatus) -> VmStatus {
        VmStatus {
            addresses: status
                .addresses
                .into_iter()
                .map(|a| self.string(a))
                .collect(),
            message: status.message.map(|m| self.string(m)),
            ..status
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_every_occurrence_and_leaves_clean_text_borrowed() {
        let r = Redactor::new(["s3cr3t-value"]);
        assert_eq!(
            r.text("a s3cr3t-value and s3cr3t-value"),
            "a [redacted] and [redacted]"
        );
        assert!(matches!(r.text("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn longest_value_wins() {
        let r = Redactor::new(["abcd", "abcdefgh"]);
        assert_eq!(r.text("xabcdefghx abcd"), "x[redacted]x [redacted]");
    }

    #[test]
    fn short_values_are_ignored() {
        let r = Redactor::new(["us", "", "abc"]);
        assert!(r.is_empty());
        assert_eq!(r.text("us abc"), "us abc");
    }

    #[test]
    fn errors_and_the_text_of_statuses_are_redacted() {
        let r = Redactor::new(["TOKEN123"]);
        let e = r.provider_error(ProviderError::RateLimited {
            retry_after: std::time::Duration::from_secs(1),
            message: "slow TOKEN123".into(),
        });
        assert!(!e.to_string().contains("TOKEN123"), "{e}");
        let s = r.status(VmStatus {
            id: "i-TOKEN123".into(),
            phase: crate::Phase::Running,
            addresses: vec!["TOKEN123.example".into()],
            message: Some("TOKEN123".into()),
            owner: Some("uid-TOKEN123".into()),
        });
        assert_eq!(s.addresses, vec!["[redacted].example".to_string()]);
        assert_eq!(s.message.as_deref(), Some(REDACTED));
        let debug = format!("{r:?}");
        assert!(!debug.contains("TOKEN123"), "{debug}");
    }

    #[test]
    fn identity_is_never_rewritten() {
        let r = Redactor::new(["123456789012"]);
        let s = r.status(VmStatus {
            id: "vm-123456789012-1".into(),
            phase: crate::Phase::Running,
            addresses: Vec::new(),
            message: Some("in account 123456789012".into()),
            owner: Some("uid-123456789012".into()),
        });
        assert_eq!(s.id, "vm-123456789012-1");
        assert_eq!(s.owner.as_deref(), Some("uid-123456789012"));
        assert_eq!(s.message.as_deref(), Some("in account [redacted]"));
    }
}
