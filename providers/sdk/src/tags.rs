//! vmop's conventions for finding a machine again without any memory between calls: every
//! machine carries the VM's uid (and, for people, its namespace and name) as tags or labels,
//! `find` and `create` look it up by the uid, and when a race made several, every caller
//! settles on the same one, the oldest. It also carries the cluster that made it
//! (`provider-config.cluster`), which `list` filters by: another cluster's machines are never
//! this one's.
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
/// The cluster that made the machine (`provider-config.cluster`): what `list` searches by.
pub const TAG_CLUSTER: &str = "vmop.dev/cluster";

/// vmop's own tags for `spec`, made by the cluster `cluster`: namespace, name and uid, then the
/// cluster unless it is empty (a call that names no cluster marks no cluster).
pub fn own<'a>(spec: &'a VmSpec, cluster: &'a str) -> Vec<(&'static str, &'a str)> {
    let mut tags = vec![
        (TAG_NAMESPACE, spec.namespace.as_str()),
        (TAG_NAME, spec.name.as_str()),
        (TAG_UID, spec.uid.as_str()),
    ];
    if !cluster.is_empty() {
        tags.push((TAG_CLUSTER, cluster));
    }
    tags
}

/// Whether `key` is one of vmop's own tags (which no setting or label may replace: a replaced
/// uid tag hides the machine from `find`, a replaced cluster tag from `list`).
pub fn is_own(key: &str) -> bool {
    [TAG_UID, TAG_NAMESPACE, TAG_NAME, TAG_CLUSTER].contains(&key)
}

/// What a cloud accepts as tags, for [`Rules::for_spec`] and [`Rules::parse_list`]. Lengths are
/// in characters; keys are never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The key the cloud's console shows as the machine's name (ec2: `Name`): set to the VM's
    /// name before vmop's own tags, and reserved like them. `None` for clouds without one.
    pub name_key: Option<&'static str>,
    /// Tags per machine, vmop's own included.
    pub max_tags: usize,
    pub max_key_chars: usize,
    pub max_value_chars: usize,
    /// A key prefix the cloud keeps for itself (ec2: `aws:`), compared ignoring ASCII case.
    pub reserved_prefix: Option<&'static str>,
}

impl Rules {
    /// No limits beyond a non-empty key: clouds that keep tags in a free-form map.
    pub const ANY: Rules = Rules {
        name_key: None,
        max_tags: usize::MAX,
        max_key_chars: usize::MAX,
        max_value_chars: usize::MAX,
        reserved_prefix: None,
    };

    /// Whether the cloud takes `key=value`.
    pub fn admits(&self, key: &str, value: &str) -> bool {
        !key.is_empty()
            && key.chars().count() <= self.max_key_chars
            && value.chars().count() <= self.max_value_chars
            && self.reserved_prefix.is_none_or(|prefix| {
                !key.get(..prefix.len())
                    .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
            })
    }

    /// Whether `key` is one no list or label may set: vmop's own, or the name key.
    fn is_reserved(&self, key: &str) -> bool {
        is_own(key) || self.name_key == Some(key)
    }

    /// What an entry must look like, for error messages.
    fn describe(&self) -> String {
        let mut shape = String::from("`key=value`");
        if self.max_key_chars < usize::MAX || self.max_value_chars < usize::MAX {
            shape.push_str(&format!(
                " with a key of 1..={} and a value of ≤{} characters",
                self.max_key_chars, self.max_value_chars
            ));
        }
        if let Some(prefix) = self.reserved_prefix {
            shape.push_str(&format!(" outside the reserved `{prefix}` prefix"));
        }
        shape
    }

    /// A `key=value,key=value` list (a `tags` setting or parameter), trimmed, empty entries
    /// skipped. An entry without `=`, one the cloud does not take ([`Rules::admits`]), a key
    /// given twice, one of vmop's own keys and the name key are `invalid-spec` errors naming
    /// the entry.
    pub fn parse_list<'a>(&self, list: &'a str) -> Result<Vec<(&'a str, &'a str)>, ProviderError> {
        let mut tags: Vec<(&str, &str)> = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (key, value) = entry
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .filter(|(k, v)| self.admits(k, v))
                .ok_or_else(|| invalid_spec(format!("tag `{entry}` is not {}", self.describe())))?;
            if self.is_reserved(key) || tags.iter().any(|(k, _)| *k == key) {
                return Err(invalid_spec(format!(
                    "tag `{key}` is given twice or is one of vmop's own tags"
                )));
            }
            tags.push((key, value));
        }
        Ok(tags)
    }

    /// Every tag for `spec`'s machine made by `cluster`: the name key if any, vmop's own
    /// ([`own`]), then those of `extra` (a `tags` list, checked by [`Rules::parse_list`]), then
    /// as many of the VM's labels as [`Rules::max_tags`] leaves room for. Too many explicit
    /// tags are an `invalid-spec` error; labels are best effort (one the cloud does not take,
    /// one of the reserved keys, or one whose key is already used, is skipped: a label never
    /// fails a create, and never sets a mark vmop did not, such as the cluster of a call that
    /// names none).
    pub fn for_spec<'a>(
        &self,
        spec: &'a VmSpec,
        cluster: &'a str,
        extra: Option<&'a str>,
    ) -> Result<Vec<(&'a str, &'a str)>, ProviderError> {
        let mut tags: Vec<(&str, &str)> = self
            .name_key
            .map(|key| (key, spec.name.as_str()))
            .into_iter()
            .chain(own(spec, cluster))
            .collect();
        let fixed = tags.len();
        tags.extend(self.parse_list(extra.unwrap_or_default())?);
        if tags.len() > self.max_tags {
            return Err(invalid_spec(format!(
                "{} tags; the cloud allows {} per machine, {fixed} of them vmop's",
                tags.len(),
                self.max_tags
            )));
        }
        for (key, value) in &spec.labels {
            if tags.len() >= self.max_tags {
                break;
            }
            if self.admits(key, value)
                && !self.is_reserved(key)
                && !tags.iter().any(|(k, _)| k == key)
            {
                tags.push((key, value));
            }
        }
        Ok(tags)
    }
}

/// [`Rules::parse_list`] under [`Rules::ANY`].
pub fn parse_list(list: &str) -> Result<Vec<(&str, &str)>, ProviderError> {
    Rules::ANY.parse_list(list)
}

/// [`Rules::for_spec`] under [`Rules::ANY`]: vmop's own tags, then those of `extra`, then the
/// VM's labels whose keys are still free.
pub fn for_spec<'a>(
    spec: &'a VmSpec,
    cluster: &'a str,
    extra: Option<&'a str>,
) -> Result<Vec<(&'a str, &'a str)>, ProviderError> {
    Rules::ANY.for_spec(spec, cluster, extra)
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
        let spec = spec(&[
            ("app", "web"),
            ("team", "label-loses"),
            (TAG_UID, "x"),
            (TAG_CLUSTER, "other"),
        ]);
        let tags = for_spec(&spec, "c-1", Some(" team = a ,, cost=42")).unwrap();
        assert_eq!(
            tags,
            [
                (TAG_NAMESPACE, "team-a"),
                (TAG_NAME, "web"),
                (TAG_UID, "u-1"),
                (TAG_CLUSTER, "c-1"),
                ("team", "a"),
                ("cost", "42"),
                ("app", "web"),
            ]
        );
        assert_eq!(for_spec(&spec, "c-1", None).unwrap().len(), 6);
    }

    #[test]
    fn no_cluster_no_cluster_tag() {
        let spec = spec(&[]);
        assert_eq!(
            own(&spec, ""),
            [
                (TAG_NAMESPACE, "team-a"),
                (TAG_NAME, "web"),
                (TAG_UID, "u-1")
            ]
        );
        assert_eq!(own(&spec, "c-1").last(), Some(&(TAG_CLUSTER, "c-1")));
        let labelled = self::spec(&[(TAG_CLUSTER, "forged")]);
        assert!(
            !for_spec(&labelled, "", None)
                .unwrap()
                .iter()
                .any(|(k, _)| *k == TAG_CLUSTER),
            "a label never sets the cluster mark"
        );
    }

    #[test]
    fn lists_are_checked() {
        for bad in [
            "novalue",
            "=v",
            "vmop.dev/uid=other",
            "vmop.dev/cluster=other",
            "a=1,a=2",
        ] {
            assert!(
                matches!(parse_list(bad), Err(ProviderError::InvalidSpec(_))),
                "{bad}"
            );
        }
        assert_eq!(parse_list("empty=").unwrap(), [("empty", "")]);
    }

    /// EC2's rules, the strictest a provider uses.
    const EC2: Rules = Rules {
        name_key: Some("Name"),
        max_tags: 50,
        max_key_chars: 128,
        max_value_chars: 256,
        reserved_prefix: Some("aws:"),
    };

    #[test]
    fn the_name_key_comes_first_and_labels_the_cloud_refuses_are_skipped() {
        let spec = spec(&[("app", "web"), ("team", "label-loses"), ("AWS:x", "y")]);
        let tags = EC2
            .for_spec(&spec, "c-1", Some(" team = a , cost=42,"))
            .unwrap();
        assert_eq!(
            tags,
            [
                ("Name", "web"),
                (TAG_NAMESPACE, "team-a"),
                (TAG_NAME, "web"),
                (TAG_UID, "u-1"),
                (TAG_CLUSTER, "c-1"),
                ("team", "a"),
                ("cost", "42"),
                ("app", "web"),
            ]
        );
    }

    #[test]
    fn lists_are_checked_against_the_clouds_rules() {
        let spec = spec(&[]);
        let long_key = format!("{}=v", "k".repeat(129));
        let long_value = format!("k={}", "v".repeat(257));
        for bad in [
            "novalue",
            "=v",
            "aws:cf=1",
            "Aws:cf=1",
            "vmop.dev/uid=other",
            "Name=other",
            "a=1,a=2",
            &long_key,
            &long_value,
        ] {
            match EC2.for_spec(&spec, "c-1", Some(bad)) {
                Err(ProviderError::InvalidSpec(m)) => assert!(m.contains("tag"), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        match EC2.parse_list("aws:cf=1") {
            Err(ProviderError::InvalidSpec(m)) => {
                assert!(m.contains("1..=128") && m.contains("`aws:`"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            EC2.for_spec(&spec, "c-1", Some("empty=")).is_ok(),
            "empty values are fine"
        );
        assert!(
            EC2.admits(&"k".repeat(128), &"é".repeat(256)),
            "characters, not bytes"
        );
        let many: Vec<String> = (0..46).map(|i| format!("k{i}=v")).collect();
        assert!(matches!(
            EC2.for_spec(&spec, "c-1", Some(&many.join(","))),
            Err(ProviderError::InvalidSpec(m)) if m.contains("51 tags") && m.contains("5 of them")
        ));
        assert!(
            EC2.for_spec(&spec, "", Some(&many.join(","))).is_ok(),
            "without a cluster one more fits"
        );
    }

    #[test]
    fn labels_fill_up_to_the_limit() {
        let labels: Vec<(String, String)> =
            (0..60).map(|i| (format!("l{i}"), "v".to_owned())).collect();
        let refs: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let spec = spec(&refs);
        let tags = EC2.for_spec(&spec, "c-1", Some("a=1")).unwrap();
        assert_eq!(tags.len(), EC2.max_tags);
        assert_eq!(tags.last(), Some(&("l43", "v")));
        assert_eq!(
            for_spec(&spec, "c-1", Some("a=1")).unwrap().len(),
            65,
            "no limit"
        );
    }

    #[test]
    fn the_oldest_candidate_wins() {
        let found = vec![("b", 7), ("a", 3), ("c", 9)];
        assert_eq!(oldest(found, |(_, age)| *age), Some(("a", 3)));
        assert_eq!(oldest(Vec::<u8>::new(), |n| *n), None);
    }
}
