//! vmop's conventions for finding a machine again without any memory between calls: every
//! machine carries the VM's uid (and, for people, its namespace and name) as tags or labels,
//! `find` and `create` look it up by the uid, and when a race made several, every caller
//! settles on the same one, the oldest.
//!
//! The tag names are the same for every provider (`vmop.dev/uid`, ...), so an operator can
//! find vmop's machines in any cloud's console with one filter.

use crate::error::invalid_spec;
use crate::{ProviderError, VmSpec};

/// The VM's `metadata.uid`: what `find` searches by.
pub const TAG_UID: &str = "vmop.dev/uid";
/// The VM's namespace.
pub const TAG_NAMESPACE: &str = "vmop.dev/namespace";
/// The VM's name.
pub const TAG_NAME: &str = "vmop.dev/name";

/// vmop's own tags for `spec`: namespace, name and uid.
pub fn own(spec: &VmSpec) -> [(&'static str, &str); 3] {
    [
        (TAG_NAMESPACE, spec.namespace.as_str()),
        (TAG_NAME, spec.name.as_str()),
        (TAG_UID, spec.uid.as_str()),
    ]
}

/// Whether `key` is one of vmop's own tags (which no setting or label may replace: a replaced
/// uid tag hides the machine from `find`).
pub fn is_own(key: &str) -> bool {
    [TAG_UID, TAG_NAMESPACE, TAG_NAME].contains(&key)
}

/// A `key=value,key=value` list (a `tags` setting or parameter), trimmed, empty entries
/// skipped. An entry without `=` or with an empty key, a key given twice and one of vmop's
/// own keys are `invalid-spec` errors naming the entry.
pub fn parse_list(list: &str) -> Result<Vec<(&str, &str)>, ProviderError> {
    let mut tags: Vec<(&str, &str)> = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| invalid_spec(format!("tag `{entry}` is not `key=value`")))?;
        if is_own(key) || tags.iter().any(|(k, _)| *k == key) {
            return Err(invalid_spec(format!(
                "tag `{key}` is given twice or is one of vmop's own tags"
            )));
        }
        tags.push((key, value));
    }
    Ok(tags)
}

/// Every tag for `spec`'s machine: vmop's own, then those of `extra` (a `tags` list, checked
/// by [`parse_list`]), then the VM's labels whose keys are still free (best effort: a label
/// never fails a create).
pub fn for_spec<'a>(
    spec: &'a VmSpec,
    extra: Option<&'a str>,
) -> Result<Vec<(&'a str, &'a str)>, ProviderError> {
    let mut tags = own(spec).to_vec();
    tags.extend(parse_list(extra.unwrap_or_default())?);
    for (key, value) in &spec.labels {
        if !tags.iter().any(|(k, _)| k == key) {
            tags.push((key, value));
        }
    }
    Ok(tags)
}

/// The machine to answer for one uid among `candidates`: the one with the smallest `age` key
/// (creation time or sequence). Several candidates mean racing creates made duplicates; every
/// call picking the oldest keeps the answer stable, and the others stay visible to whoever
/// cleans up. Log the count yourself if it matters (`candidates.len() > 1`).
pub fn oldest<T, K: Ord>(candidates: Vec<T>, age: impl Fn(&T) -> K) -> Option<T> {
    candidates.into_iter().min_by_key(|c| age(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(labels: &[(&str, &str)]) -> VmSpec {
        VmSpec {
            name: "web".into(),
            namespace: "team-a".into(),
            uid: "u-1".into(),
            image: "img".into(),
            cpu: 1,
            memory_mib: 512,
            user_data: None,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            parameters: Vec::new(),
        }
    }

    #[test]
    fn own_tags_then_the_list_then_free_labels() {
        let spec = spec(&[("app", "web"), ("team", "label-loses"), (TAG_UID, "x")]);
        let tags = for_spec(&spec, Some(" team = a ,, cost=42")).unwrap();
        assert_eq!(
            tags,
            [
                (TAG_NAMESPACE, "team-a"),
                (TAG_NAME, "web"),
                (TAG_UID, "u-1"),
                ("team", "a"),
                ("cost", "42"),
                ("app", "web"),
            ]
        );
        assert_eq!(for_spec(&spec, None).unwrap().len(), 5);
    }

    #[test]
    fn lists_are_checked() {
        for bad in ["novalue", "=v", "vmop.dev/uid=other", "a=1,a=2"] {
            assert!(
                matches!(parse_list(bad), Err(ProviderError::InvalidSpec(_))),
                "{bad}"
            );
        }
        assert_eq!(parse_list("empty=").unwrap(), [("empty", "")]);
    }

    #[test]
    fn the_oldest_candidate_wins() {
        let found = vec![("b", 7), ("a", 3), ("c", 9)];
        assert_eq!(oldest(found, |(_, age)| *age), Some(("a", 3)));
        assert_eq!(oldest(Vec::<u8>::new(), |n| *n), None);
    }
}
