//! Turning a ProviderConfig into something that can make calls: its plugin (through the
//! registry), its credentials (from the Secret cache of the operator's namespace), its egress
//! policy and its limiter.
//!
//! # Credentials
//!
//! Under `spec.credentials` `aws-sigv4`, `bearer` or `header` the Secret's values go into the
//! egress policy's [`RequestSigner`] and the plugin's `config.secrets` is empty
//! (`provider::tests::signing_modes_hand_the_plugin_no_secret`); under `passthrough` they are the
//! plugin's `config.secrets`. Either way every value is in the policy's redactor.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{CredentialsMode, ProviderConfig};
use crate::controller::runtime::limiter::{Limiter, Limiters, Permit};
use crate::plugin::{
    CallContext, CallLimits, Connections, EgressParseError, EgressPolicy, LoadError, Plugin,
    PluginRegistry, ProviderSettings, Redactor, RequestSigner, SignerError, SigningMode,
};

/// Why a ProviderConfig cannot be used. Each variant has a condition reason.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("ProviderConfig {name} does not exist")]
    NotFound { name: String },
    #[error(
        "credentials Secret {namespace}/{name} is outside the operator namespace {allowed}, the only one where vmop may read Secrets"
    )]
    SecretNamespace {
        namespace: String,
        name: String,
        allowed: String,
    },
    #[error("credentials Secret {namespace}/{name} does not exist")]
    SecretNotFound { namespace: String, name: String },
    #[error("key {key:?} of credentials Secret {namespace}/{name} is not UTF-8")]
    SecretNotUtf8 {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("spec.allowedHosts is invalid")]
    AllowedHosts(#[source] EgressParseError),
    #[error("the credentials Secret cannot be used for spec.credentials {mode}")]
    Credentials {
        mode: &'static str,
        #[source]
        source: SignerError,
    },
    #[error("failed to load plugin {path}")]
    Plugin {
        path: String,
        #[source]
        source: LoadError,
    },
}

impl ResolveError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ResolveError::NotFound { .. } => "ProviderConfigNotFound",
            ResolveError::SecretNamespace { .. } => "SecretNotAllowed",
            ResolveError::SecretNotFound { .. } => "SecretNotFound",
            ResolveError::SecretNotUtf8 { .. } => "InvalidSecret",
            ResolveError::AllowedHosts(_) => "InvalidAllowedHosts",
            ResolveError::Credentials { .. } => "InvalidCredentials",
            ResolveError::Plugin { source, .. } if source.is_digest_mismatch() => {
                "PluginDigestMismatch"
            }
            ResolveError::Plugin { .. } => "PluginNotLoaded",
        }
    }

    /// Whether the problem can only go away through a watched change (of the ProviderConfig or
    /// its Secret). A plugin that fails to load is retried with backoff instead: a missing file
    /// may appear, and only files that loaded once are watched for changes.
    pub fn awaits_change(&self) -> bool {
        !matches!(self, ResolveError::Plugin { .. })
    }
}

/// A ProviderConfig ready for calls.
#[derive(Debug, Clone)]
pub struct Provider {
    pub name: String,
    pub plugin: Arc<Plugin>,
    pub call: CallContext,
    /// Changes whenever anything a call depends on changes (settings, credentials, plugin).
    pub identity: u64,
    /// `spec.limits.creationGracePeriodSeconds`.
    pub grace: Duration,
    /// `spec.credentials` as resolved.
    pub credentials: CredentialsMode,
    limiter: Arc<Limiter>,
}

impl Provider {
    /// Whether the plugin holds the Secret's values (`spec.credentials: passthrough`): for the
    /// ProviderConfig's status and its Event.
    pub fn is_passthrough(&self) -> bool {
        self.credentials.is_passthrough()
    }

    /// A permit for one call by `caller` (hold it for the duration of the call), or how long
    /// to wait before asking again. Never waits.
    pub fn try_permit(&self, caller: &str, taken: u32) -> Result<Permit, Duration> {
        self.limiter.try_acquire(caller, taken)
    }

    /// A permit for a routine call (a drift check), which yields to callers waiting for one.
    pub fn try_routine_permit(&self) -> Result<Permit, Duration> {
        self.limiter.try_acquire_routine()
    }

    /// [`Provider::try_permit`] for a call that changes a machine (the mutating budget too).
    pub fn try_write_permit(&self, caller: &str, taken: u32) -> Result<Permit, Duration> {
        self.limiter.try_acquire_write(caller, taken)
    }

    /// The cloud throttled a call that changes a machine; returns the shared and the mutating
    /// budget now.
    pub fn write_throttled(&self) -> (f64, Option<f64>) {
        self.limiter.write_throttled()
    }

    /// Calls that change machines allowed per second now, when they have their own budget.
    pub fn write_budget(&self) -> Option<f64> {
        self.limiter.write_budget()
    }

    /// The cloud answered a call "throttled": fewer calls per second from now on (climbing
    /// back while it does not). Returns the budget now, calls per second.
    pub fn throttled(&self) -> f64 {
        self.limiter.throttled()
    }

    /// Calls per second this ProviderConfig may make now.
    pub fn budget(&self) -> f64 {
        self.limiter.budget()
    }
}

/// Everything needed to resolve a ProviderConfig.
#[derive(Debug)]
pub struct Resolver {
    pub configs: Store<ProviderConfig>,
    pub secrets: Store<Secret>,
    pub registry: PluginRegistry,
    pub limiters: Limiters,
    /// Idle connections of every ProviderConfig's plugin calls, kept across reconciles (each
    /// resolve builds a new egress policy; the connections outlive it).
    pub connections: Connections,
    /// The only namespace whose Secrets may be used.
    pub operator_namespace: String,
    /// This cluster's identity, handed to every call (`provider-config.cluster`).
    pub cluster_id: String,
}

impl Resolver {
    /// The ProviderConfig called `name`, as last seen by the watch.
    pub fn lookup(&self, name: &str) -> Option<Arc<ProviderConfig>> {
        self.configs.get(&ObjectRef::new(name))
    }

    /// Resolves the ProviderConfig called `name`.
    pub async fn resolve_name(&self, name: &str) -> Result<Provider, ResolveError> {
        let config = self.lookup(name).ok_or_else(|| ResolveError::NotFound {
            name: name.to_owned(),
        })?;
        self.resolve(&config).await
    }

    /// Resolves `config`: credentials, egress policy, plugin (loaded or reloaded when its file
    /// changed), limiter.
    pub async fn resolve(&self, config: &ProviderConfig) -> Result<Provider, ResolveError> {
        let spec = &config.spec;
        let secret = credentials(&self.secrets, &self.operator_namespace, config)?;
        let credentials_hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            secret.hash(&mut h);
            spec.credentials.as_str().hash(&mut h);
            h.finish()
        };
        let egress = EgressPolicy::parse(&spec.allowed_hosts)
            .map_err(ResolveError::AllowedHosts)?
            .allow_private_networks(spec.allow_private_networks)
            .with_connections(self.connections.clone());
        let (secrets, egress) = apply_credentials(config, secret, egress)?;
        let plugin = self
            .registry
            .load(
                PathBuf::from(&spec.plugin.path),
                spec.plugin.sha256.as_deref(),
            )
            .await
            .map_err(|source| ResolveError::Plugin {
                path: spec.plugin.path.clone(),
                source,
            })?;
        let name = config.name_any();
        let limits = &spec.limits;
        let call = CallContext {
            settings: ProviderSettings {
                settings: spec.config.clone(),
                secrets,
                cluster: self.cluster_id.clone(),
            },
            egress,
            limits: CallLimits {
                timeout: Duration::from_secs(u64::from(limits.call_timeout_seconds)),
                memory_bytes: (limits.memory_mib as usize).saturating_mul(1 << 20),
                ..CallLimits::default()
            },
            label: name.clone(),
        };
        let identity = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            // The raw Secret, not what the plugin is handed: under host-side signing the plugin
            // gets no secret, yet another account is another location.
            spec.config.hash(&mut h);
            credentials_hash.hash(&mut h);
            plugin.digest().hash(&mut h);
            h.finish()
        };
        Ok(Provider {
            limiter: self.limiters.get(&name, limits),
            grace: Duration::from_secs(u64::from(limits.creation_grace_period_seconds)),
            identity,
            name,
            plugin,
            call,
            credentials: spec.credentials,
        })
    }
}

/// The plugin's `config.secrets` and `egress` completed with `config`'s credentials mode:
/// the signer (signing modes, when a Secret is named) and the redactor of every value.
pub fn apply_credentials(
    config: &ProviderConfig,
    secret: BTreeMap<String, String>,
    egress: EgressPolicy,
) -> Result<(BTreeMap<String, String>, EgressPolicy), ResolveError> {
    let spec = &config.spec;
    let egress = egress.with_redactor(Redactor::new(secret.values().cloned()));
    let mode = match spec.credentials {
        CredentialsMode::Passthrough => return Ok((secret, egress)),
        CredentialsMode::AwsSigV4 => SigningMode::AwsSigV4,
        CredentialsMode::Bearer => SigningMode::Bearer,
        CredentialsMode::Header => SigningMode::Header,
    };
    if spec.credentials_secret_ref.is_none() {
        return Ok((BTreeMap::new(), egress));
    }
    let signer = RequestSigner::new(mode, &spec.config, &secret).map_err(|source| {
        ResolveError::Credentials {
            mode: spec.credentials.as_str(),
            source,
        }
    })?;
    Ok((BTreeMap::new(), egress.with_signer(signer)))
}

/// Every key of `config`'s credentials Secret, read from `secrets` (the cache of the operator
/// namespace); nothing when it names none. A Secret outside `operator_namespace` is refused
/// even if it were cached.
pub fn credentials(
    secrets: &Store<Secret>,
    operator_namespace: &str,
    config: &ProviderConfig,
) -> Result<BTreeMap<String, String>, ResolveError> {
    let Some(r) = &config.spec.credentials_secret_ref else {
        return Ok(BTreeMap::new());
    };
    if r.namespace != operator_namespace {
        return Err(ResolveError::SecretNamespace {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            allowed: operator_namespace.to_owned(),
        });
    }
    let secret = secrets
        .get(&ObjectRef::new(&r.name).within(&r.namespace))
        .ok_or_else(|| ResolveError::SecretNotFound {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        })?;
    let mut out = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        let text = String::from_utf8(value.0.clone()).map_err(|_| ResolveError::SecretNotUtf8 {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            key: key.clone(),
        })?;
        out.insert(key.clone(), text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Limits, PluginSource, ProviderConfigSpec, SecretRef};
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    fn config(secret: Option<(&str, &str)>) -> ProviderConfig {
        ProviderConfig::new(
            "aws",
            ProviderConfigSpec {
                plugin: PluginSource {
                    path: "ec2.wasm".into(),
                    sha256: None,
                },
                config: BTreeMap::new(),
                credentials_secret_ref: secret.map(|(namespace, name)| SecretRef {
                    namespace: namespace.into(),
                    name: name.into(),
                }),
                credentials: CredentialsMode::Passthrough,
                allowed_hosts: Vec::new(),
                allow_private_networks: false,
                limits: Limits::default(),
                orphan_policy: Default::default(),
            },
        )
    }

    /// `(namespace, name, [(key, value)])`.
    type SecretFixture<'a> = (&'a str, &'a str, Vec<(&'a str, &'a [u8])>);

    fn store(secrets: Vec<SecretFixture<'_>>) -> Store<Secret> {
        let (reader, mut writer) = kube::runtime::reflector::store();
        for (namespace, name, data) in secrets {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some(namespace.into()),
                    ..ObjectMeta::default()
                },
                data: Some(
                    data.into_iter()
                        .map(|(k, v)| (k.to_owned(), ByteString(v.to_vec())))
                        .collect(),
                ),
                ..Secret::default()
            };
            writer.apply_watcher_event(&Event::Apply(secret));
        }
        reader
    }

    #[test]
    fn reads_every_key_of_the_secret_in_the_operator_namespace() {
        let secrets = store(vec![(
            "ops",
            "aws",
            vec![("id", b"AKID"), ("key", b"s3cret")],
        )]);
        let creds = credentials(&secrets, "ops", &config(Some(("ops", "aws")))).unwrap();
        assert_eq!(creds.get("id").map(String::as_str), Some("AKID"));
        assert_eq!(creds.get("key").map(String::as_str), Some("s3cret"));
        assert!(
            credentials(&secrets, "ops", &config(None))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn signing_modes_hand_the_plugin_no_secret() {
        let secret: BTreeMap<String, String> = [
            ("access_key_id".to_owned(), "AKIDSIGNING".to_owned()),
            (
                "secret_access_key".to_owned(),
                "s3cret-signing-key".to_owned(),
            ),
        ]
        .into();
        let mut pc = config(Some(("ops", "aws")));
        pc.spec.config.insert("region".into(), "us-east-1".into());
        pc.spec.credentials = CredentialsMode::AwsSigV4;
        let (plugin_secrets, egress) =
            apply_credentials(&pc, secret.clone(), EgressPolicy::deny_all()).unwrap();
        assert!(plugin_secrets.is_empty());
        assert!(egress.signs());
        assert_eq!(egress.redactor().text("s3cret-signing-key"), "[redacted]");

        pc.spec.credentials = CredentialsMode::Passthrough;
        let (plugin_secrets, egress) =
            apply_credentials(&pc, secret.clone(), EgressPolicy::deny_all()).unwrap();
        assert_eq!(plugin_secrets, secret);
        assert!(!egress.signs());
        assert_eq!(egress.redactor().text("AKIDSIGNING"), "[redacted]");

        pc.spec.credentials = CredentialsMode::Bearer;
        let err = apply_credentials(&pc, secret, EgressPolicy::deny_all()).unwrap_err();
        assert_eq!(err.reason(), "InvalidCredentials");
        assert!(!format!("{err:#?}").contains("s3cret"), "{err:#?}");
    }

    #[test]
    fn refuses_other_namespaces_missing_secrets_and_binary_values() {
        let secrets = store(vec![
            ("elsewhere", "aws", vec![("id", b"AKID")]),
            ("ops", "binary", vec![("key", &[0xff, 0xfe])]),
        ]);
        let err = credentials(&secrets, "ops", &config(Some(("elsewhere", "aws")))).unwrap_err();
        assert_eq!(err.reason(), "SecretNotAllowed");
        let err = credentials(&secrets, "ops", &config(Some(("ops", "missing")))).unwrap_err();
        assert_eq!(err.reason(), "SecretNotFound");
        let err = credentials(&secrets, "ops", &config(Some(("ops", "binary")))).unwrap_err();
        assert_eq!(err.reason(), "InvalidSecret");
        assert!(
            !err.to_string().contains('\u{fffd}'),
            "the message must not echo the value"
        );
    }
}
