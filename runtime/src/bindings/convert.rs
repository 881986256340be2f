//! The conversions every contract version shares, written once: the generated types of 0.2 and
//! 0.3 have the same shape but are distinct Rust types, so each version module expands
//! [`shared_conversions!`] with its own `wit` (its `types` interface) in scope.

/// `From` impls between the generated types of the `wit` module in scope and
/// [`crate::types`], for every type whose shape is the same in each version.
macro_rules! shared_conversions {
    () => {
        use std::time::Duration;

        use crate::types::{
            Parameter, ParameterKind, Phase, PluginInfo, ProviderError, UpdateOutcome,
        };

        fn pairs(m: &std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        }

        impl From<&crate::types::VmSpec> for wit::VmSpec {
            fn from(s: &crate::types::VmSpec) -> Self {
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

        impl From<wit::VmStatus> for crate::types::VmStatus {
            fn from(s: wit::VmStatus) -> Self {
                crate::types::VmStatus {
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

        impl wit::Host for crate::state::State {}

        impl log::Host for crate::state::State {
            fn log(&mut self, level: log::Level, message: String) {
                let level = match level {
                    log::Level::Trace => tracing::Level::TRACE,
                    log::Level::Debug => tracing::Level::DEBUG,
                    log::Level::Info => tracing::Level::INFO,
                    log::Level::Warn => tracing::Level::WARN,
                    log::Level::Error => tracing::Level::ERROR,
                };
                self.log.write(level, &message);
            }
        }
    };
}
