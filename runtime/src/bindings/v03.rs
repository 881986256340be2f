//! Contract 0.3 (`wit/provider.wit`): the current one.

use crate::types::{ListedMachine, Page, ProviderSettings};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    // `log` is a cheap synchronous host function; the exports are called on async stores.
    exports: { default: async },
});

use self::vmop::provider::log;
use self::vmop::provider::types as wit;
pub(crate) use self::vmop::provider::types::{ProviderConfig, VmSpec};

shared_conversions!();

impl From<&ProviderSettings> for ProviderConfig {
    fn from(s: &ProviderSettings) -> Self {
        ProviderConfig {
            settings: pairs(&s.settings),
            secrets: pairs(&s.secrets),
            cluster: s.cluster.clone(),
        }
    }
}

impl From<wit::Page> for Page {
    fn from(p: wit::Page) -> Self {
        Page {
            machines: p
                .machines
                .into_iter()
                .map(|m| ListedMachine {
                    status: m.status.into(),
                    cluster: m.cluster,
                    created_at_ms: m.created_at_ms,
                })
                .collect(),
            next: p.next,
        }
    }
}
