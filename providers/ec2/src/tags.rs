//! The tags an instance is launched with: vmop's own (what `find` searches by), the `tags`
//! setting or parameter, and the VM's labels.

use vmop_provider_sdk::error::invalid_spec;
pub use vmop_provider_sdk::tags::TAG_UID;
use vmop_provider_sdk::tags::own;
use vmop_provider_sdk::{ProviderError, VmSpec};

/// EC2 allows 50 tags per resource.
const MAX_TAGS: usize = 50;

/// `Name`, namespace, name and uid; then each `key=value` of `extra` (the `tags` setting or
/// parameter, comma-separated); then as many labels as EC2's limit leaves room for.
///
/// Explicit tags are checked: a malformed entry, one EC2 refuses, or one that would replace
/// vmop's own tags (and so hide the instance from `find`) is an `invalid-spec` error. Labels
/// are best effort: those EC2 cannot take, and those whose key is already used, are skipped.
pub fn for_spec<'a>(
    spec: &'a VmSpec,
    extra: Option<&'a str>,
) -> Result<Vec<(&'a str, &'a str)>, ProviderError> {
    let mut tags = vec![("Name", spec.name.as_str())];
    tags.extend(own(spec));
    let explicit = extra
        .into_iter()
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|entry| !entry.is_empty());
    for entry in explicit {
        let (key, value) = entry
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, v)| is_taggable(k, v))
            .ok_or_else(|| {
                invalid_spec(format!(
                    "tag `{entry}` is not `key=value` with a key of 1..=128 and a value of \
                     ≤256 characters outside the reserved `aws:` prefix"
                ))
            })?;
        if tags.iter().any(|(k, _)| *k == key) {
            return Err(invalid_spec(format!(
                "tag `{key}` is given twice or is one of vmop's own tags"
            )));
        }
        tags.push((key, value));
    }
    if tags.len() > MAX_TAGS {
        return Err(invalid_spec(format!(
            "{} tags; EC2 allows {MAX_TAGS} per instance, 4 of them vmop's",
            tags.len()
        )));
    }
    for (key, value) in &spec.labels {
        if tags.len() == MAX_TAGS {
            break;
        }
        if is_taggable(key, value) && !tags.iter().any(|(k, _)| k == key) {
            tags.push((key, value));
        }
    }
    Ok(tags)
}

/// What EC2 accepts as a tag: key ≤ 128 and value ≤ 256 characters, no reserved `aws:` prefix.
fn is_taggable(key: &str, value: &str) -> bool {
    !key.is_empty()
        && key.chars().count() <= 128
        && value.chars().count() <= 256
        && !key.to_ascii_lowercase().starts_with("aws:")
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmop_provider_sdk::tags::{TAG_NAME, TAG_NAMESPACE};

    fn spec(labels: &[(&str, &str)]) -> VmSpec {
        VmSpec {
            name: "web".into(),
            namespace: "team-a".into(),
            uid: "u-1".into(),
            image: "ami-1".into(),
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
    fn own_tags_then_explicit_then_labels() {
        let spec = spec(&[("app", "web"), ("team", "label-loses"), ("aws:x", "y")]);
        let tags = for_spec(&spec, Some(" team = a , cost=42,")).unwrap();
        assert_eq!(
            tags,
            [
                ("Name", "web"),
                (TAG_NAMESPACE, "team-a"),
                (TAG_NAME, "web"),
                (TAG_UID, "u-1"),
                ("team", "a"),
                ("cost", "42"),
                ("app", "web"),
            ]
        );
    }

    #[test]
    fn explicit_tags_are_checked() {
        let spec = spec(&[]);
        for bad in ["novalue", "=v", "aws:cf=1", "vmop.dev/uid=other", "a=1,a=2"] {
            assert!(
                matches!(
                    for_spec(&spec, Some(bad)),
                    Err(ProviderError::InvalidSpec(_))
                ),
                "{bad}"
            );
        }
        assert!(
            for_spec(&spec, Some("empty=")).is_ok(),
            "empty values are fine"
        );
        let many: Vec<String> = (0..47).map(|i| format!("k{i}=v")).collect();
        assert!(for_spec(&spec, Some(&many.join(","))).is_err());
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
        let tags = for_spec(&spec, Some("a=1")).unwrap();
        assert_eq!(tags.len(), MAX_TAGS);
        assert_eq!(tags.last(), Some(&("l44", "v")));
    }
}
