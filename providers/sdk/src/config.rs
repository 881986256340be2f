//! Typed access to `provider-config`: the ProviderConfig's settings and its credentials Secret.
//!
//! A missing key is the operator's configuration error, not the cloud's: it is reported as
//! `permanent` (no retry until the ProviderConfig or Secret changes) and names the key, never a
//! value.

use std::collections::BTreeMap;
use std::fmt;

use crate::url::Url;
use crate::{ProviderConfig, ProviderError};

/// Everything a ProviderConfig hands to one call.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub settings: Settings,
    pub secrets: Secrets,
    /// This cluster's identity (`provider-config.cluster`): the mark `create` puts on machines
    /// ([`crate::tags::own`]) and `list` answers by. Empty where the host sends none (a CLI
    /// call, a `contract-0-2` build).
    pub cluster: String,
}

impl Config {
    /// [`Config::cluster`], or a `permanent` error when it is empty: `list` answers one
    /// cluster's machines, never every cluster's.
    pub fn require_cluster(&self) -> Result<&str, ProviderError> {
        if self.cluster.is_empty() {
            return Err(ProviderError::Permanent(
                "the call names no cluster (provider-config.cluster is empty), so there is no \
                 cluster whose machines to list"
                    .to_owned(),
            ));
        }
        Ok(&self.cluster)
    }
}

impl From<ProviderConfig> for Config {
    fn from(config: ProviderConfig) -> Self {
        Config {
            settings: Settings(config.settings.into_iter().collect()),
            secrets: Secrets(config.secrets.into_iter().collect()),
            #[cfg(not(feature = "contract-0-2"))]
            cluster: config.cluster,
            #[cfg(feature = "contract-0-2")]
            cluster: String::new(),
        }
    }
}

/// `ProviderConfig.spec.config`: region, endpoint, overrides. Not secret.
#[derive(Debug, Clone, Default)]
pub struct Settings(BTreeMap<String, String>);

impl Settings {
    pub fn get(&self, key: &str) -> Option<&str> {
        non_empty(&self.0, key)
    }

    /// The value of `key`, or a `permanent` error naming the missing setting.
    pub fn require(&self, key: &str) -> Result<&str, ProviderError> {
        self.get(key).ok_or_else(|| {
            ProviderError::Permanent(format!(
                "the ProviderConfig has no setting `{key}` (spec.config.{key})"
            ))
        })
    }

    /// The setting `key` parsed as an `http(s)` URL; missing or malformed, a `permanent`
    /// error naming the setting.
    pub fn require_url(&self, key: &str) -> Result<Url, ProviderError> {
        Url::parse(self.require(key)?)
            .map_err(|e| ProviderError::Permanent(format!("setting `{key}`: {e}")))
    }

    /// These settings with a VM's `spec.parameters` laid over them: the contract says a
    /// parameter overrides the setting of the same name, so one VM can pick its own subnet or
    /// size without a ProviderConfig of its own. An empty parameter unsets the setting for
    /// this VM (empty means "not set" everywhere in [`Settings`]).
    ///
    /// The host has already checked names and kinds against `plugin-info.parameters`.
    pub fn with_overrides(&self, parameters: &[(String, String)]) -> Settings {
        let mut merged = self.0.clone();
        merged.extend(parameters.iter().cloned());
        Settings(merged)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Settings {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Settings(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

/// The keys of the credentials Secret. `Debug` shows only the keys; errors name only keys.
#[derive(Clone, Default)]
pub struct Secrets(BTreeMap<String, String>);

impl Secrets {
    pub fn get(&self, key: &str) -> Option<&str> {
        non_empty(&self.0, key)
    }

    /// The value of `key`, or a `permanent` error naming the missing key of the Secret.
    pub fn require(&self, key: &str) -> Result<&str, ProviderError> {
        self.get(key).ok_or_else(|| {
            ProviderError::Permanent(format!(
                "the credentials Secret has no key `{key}` (spec.credentialsSecretRef)"
            ))
        })
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Secrets {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Secrets(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

/// A present, non-empty value: an empty string in a ConfigMap-style map means "not set".
fn non_empty<'a>(map: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    map.get(key).map(String::as_str).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_setting_is_permanent_and_names_the_key() {
        let settings: Settings = [("endpoint", "http://x")].into_iter().collect();
        match settings.require("region") {
            Err(ProviderError::Permanent(msg)) => assert!(msg.contains("`region`"), "{msg}"),
            other => panic!("expected a permanent error, got {other:?}"),
        }
        assert_eq!(settings.require("endpoint").ok(), Some("http://x"));
    }

    #[test]
    fn parameters_override_settings_of_the_same_name() {
        let settings: Settings = [
            ("subnetId", "subnet-a"),
            ("keyName", "ops"),
            ("region", "r"),
        ]
        .into_iter()
        .collect();
        let parameters = [
            ("subnetId".to_owned(), "subnet-b".to_owned()),
            ("keyName".to_owned(), String::new()),
            ("tags".to_owned(), "team=a".to_owned()),
        ];
        let merged = settings.with_overrides(&parameters);
        assert_eq!(merged.get("subnetId"), Some("subnet-b"));
        assert_eq!(merged.get("keyName"), None, "an empty parameter unsets");
        assert_eq!(merged.get("tags"), Some("team=a"));
        assert_eq!(merged.get("region"), Some("r"));
        assert_eq!(
            settings.get("subnetId"),
            Some("subnet-a"),
            "the original is unchanged"
        );
    }

    #[test]
    fn url_settings_are_parsed_or_name_the_setting() {
        let settings: Settings = [("endpoint", "http://127.0.0.1:1/"), ("bad", "ftp://x")]
            .into_iter()
            .collect();
        assert_eq!(
            settings.require_url("endpoint").ok().map(|u| u.to_string()),
            Some("http://127.0.0.1:1/".to_owned())
        );
        for key in ["bad", "missing"] {
            match settings.require_url(key) {
                Err(ProviderError::Permanent(msg)) => assert!(msg.contains(key), "{msg}"),
                other => panic!("expected a permanent error, got {other:?}"),
            }
        }
    }

    #[test]
    fn list_needs_a_cluster() {
        assert!(matches!(
            Config::default().require_cluster(),
            Err(ProviderError::Permanent(m)) if m.contains("cluster")
        ));
        let config = Config {
            cluster: "c-1".into(),
            ..Config::default()
        };
        assert_eq!(config.require_cluster().ok(), Some("c-1"));
    }

    #[test]
    fn empty_value_counts_as_missing() {
        let settings: Settings = [("region", "")].into_iter().collect();
        assert!(settings.require("region").is_err());
    }

    #[test]
    fn secret_errors_and_debug_never_show_values() {
        let secrets: Secrets = [("secret_access_key", "hunter2-very-secret")]
            .into_iter()
            .collect();
        let err = secrets
            .require("access_key_id")
            .err()
            .map(|e| format!("{e:?}"));
        let err = err.unwrap_or_default();
        assert!(err.contains("access_key_id"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let debug = format!(
            "{:?}",
            Config {
                secrets,
                ..Config::default()
            }
        );
        assert!(debug.contains("secret_access_key"), "{debug}");
        assert!(!debug.contains("hunter2"), "{debug}");
    }
}
