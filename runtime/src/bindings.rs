//! The one place that generates bindings for `wit/provider.wit` (world `plugin`), and the
//! conversions between the generated types and [`super::types`].
//!
//! Nothing outside this crate sees a generated type: the reconcilers and the CLI work with the
//! host-side types only, so a WIT change is absorbed here.

use std::time::Duration;

use super::types::{
    Parameter, ParameterKind, Phase, PluginInfo, ProviderError, ProviderSettings, UpdateOutcome,
    VmSpec, VmStatus,
};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    // `log` is a cheap synchronous host function; the exports are called on async stores.
    exports: { default: async },
});

pub(crate) use self::exports::vmop::provider::provider as wit_provider;
pub(crate) use self::vmop::provider::log as wit_log;
use self::vmop::provider::types as wit;
pub(crate) use self::vmop::provider::types::{ProviderConfig, VmSpec as WitVmSpec};

/// The WIT package version this host was built against (`package vmop:provider@X.Y.Z`).
pub const WIT_VERSION: &str = "0.2.0";

fn pairs(m: &std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

impl From<&ProviderSettings> for ProviderConfig {
    fn from(s: &ProviderSettings) -> Self {
        ProviderConfig {
            settings: pairs(&s.settings),
            secrets: pairs(&s.secrets),
        }
    }
}

impl From<&VmSpec> for wit::VmSpec {
    fn from(s: &VmSpec) -> Self {
        wit::VmSpec {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            uid: s.uid.clone(),
            image: s.image.clone(),
            cpu: s.cpu,
            memory_mib: s.memory_mib,
            user_data: s.user_data.clone(),
            labels: pairs(&s.labels),
            parameters: pairs(&s.parameters),
        }
    }
}

impl From<wit::Phase> for Phase {
    fn from(p: wit::Phase) -> Self {
        match p {
            wit::Phase::Pending => Phase::Pending,
            wit::Phase::Provisioning => Phase::Provisioning,
            wit::Phase::Running => Phase::Running,
            wit::Phase::Stopped => Phase::Stopped,
            wit::Phase::Failed => Phase::Failed,
            wit::Phase::Deleting => Phase::Deleting,
            wit::Phase::Unknown => Phase::Unknown,
        }
    }
}

impl From<wit::VmStatus> for VmStatus {
    fn from(s: wit::VmStatus) -> Self {
        VmStatus {
            id: s.id,
            phase: s.phase.into(),
            addresses: s.addresses,
            message: s.message,
            owner: s.owner,
        }
    }
}

impl From<wit::ProviderError> for ProviderError {
    fn from(e: wit::ProviderError) -> Self {
        match e {
            wit::ProviderError::Transient(m) => ProviderError::Transient(m),
            wit::ProviderError::RateLimited(r) => ProviderError::RateLimited {
                retry_after: Duration::from_millis(r.retry_after_ms),
                message: r.message,
            },
            wit::ProviderError::Permanent(m) => ProviderError::Permanent(m),
            wit::ProviderError::InvalidSpec(m) => ProviderError::InvalidSpec(m),
            wit::ProviderError::Unauthorized(m) => ProviderError::Unauthorized(m),
        }
    }
}

impl From<wit::PluginInfo> for PluginInfo {
    fn from(i: wit::PluginInfo) -> Self {
        PluginInfo {
            name: i.name,
            version: i.version,
            wit_version: i.wit_version,
            capabilities: i.capabilities,
            parameters: i.parameters.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<wit::Parameter> for Parameter {
    fn from(p: wit::Parameter) -> Self {
        Parameter {
            name: p.name,
            kind: match p.kind {
                wit::ParameterKind::Text => ParameterKind::Text,
                wit::ParameterKind::Integer => ParameterKind::Integer,
                wit::ParameterKind::Boolean => ParameterKind::Boolean,
                wit::ParameterKind::StringList => ParameterKind::StringList,
            },
            description: p.description,
            mutable: p.mutable,
        }
    }
}

impl From<wit::UpdateOutcome> for UpdateOutcome {
    fn from(o: wit::UpdateOutcome) -> Self {
        match o {
            wit::UpdateOutcome::Applied => UpdateOutcome::Applied,
            wit::UpdateOutcome::NeedsRestart => UpdateOutcome::NeedsRestart,
            wit::UpdateOutcome::NeedsReplacement => UpdateOutcome::NeedsReplacement,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn wit_version_matches_the_package() {
        let wit = include_str!("../../wit/provider.wit");
        let expected = format!("package vmop:provider@{};", super::WIT_VERSION);
        assert!(
            wit.contains(&expected),
            "wit/provider.wit does not declare {expected}"
        );
    }
}
