//! Turning a ProviderConfig into something that can make calls: its plugin (through the
//! registry), its credentials (from the Secret cache of the operator's namespace), its egress
//! policy and its limiter.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::limiter::{Limiter, Limiters, Permit};
use crate::api::ProviderConfig;
use crate::plugin::{
    CallContext, CallLimits, EgressParseError, EgressPolicy, LoadError, Plugin, PluginRegistry,
    ProviderSettings,
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
            ResolveError::Plugin {
                source: LoadError::DigestMismatch { .. },
                ..
            } => "PluginDigestMismatch",
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
    limiter: Arc<Limiter>,
}

impl Provider {
    /// Waits until this ProviderConfig's limits allow one more call; hold the permit for the
    /// duration of the call.
    pub async fn permit(&self) -> Permit {
        self.limiter.acquire().await
    }
}

/// Everything needed to resolve a ProviderConfig.
#[derive(Debug)]
pub struct Resolver {
    pub configs: Store<ProviderConfig>,
    pub secrets: Store<Secret>,
    pub registry: PluginRegistry,
    pub limiters: Limiters,
    /// The only namespace whose Secrets may be used.
    pub operator_namespace: String,
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
        let secrets = self.credentials(config)?;
        let egress =
            EgressPolicy::parse(&spec.allowed_hosts).map_err(ResolveError::AllowedHosts)?;
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
            },
            egress,
            limits: CallLimits {
                timeout: Duration::from_secs(u64::from(limits.call_timeout_seconds)),
                memory_bytes: (limits.memory_mib as usize).saturating_mul(1 << 20),
                ..CallLimits::default()
            },
            label: name.clone(),
        };
        Ok(Provider {
            limiter: self.limiters.get(&name, limits),
            name,
            plugin,
            call,
        })
    }

    fn credentials(
        &self,
        config: &ProviderConfig,
    ) -> Result<BTreeMap<String, String>, ResolveError> {
        let Some(r) = &config.spec.credentials_secret_ref else {
            return Ok(BTreeMap::new());
        };
        if r.namespace != self.operator_namespace {
            return Err(ResolveError::SecretNamespace {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                allowed: self.operator_namespace.clone(),
            });
        }
        let secret = self
            .secrets
            .get(&ObjectRef::new(&r.name).within(&r.namespace))
            .ok_or_else(|| ResolveError::SecretNotFound {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            })?;
        let mut out = BTreeMap::new();
        for (key, value) in secret.data.iter().flatten() {
            let text =
                String::from_utf8(value.0.clone()).map_err(|_| ResolveError::SecretNotUtf8 {
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    key: key.clone(),
                })?;
            out.insert(key.clone(), text);
        }
        Ok(out)
    }
}
