//! Contract 0.2 (`wit/compat/0.2/provider.wit`, frozen): plugins built before `list`. They get
//! no cluster (0.2's `provider-config` has none), so their machines carry no cluster mark.

use crate::types::ProviderSettings;

wasmtime::component::bindgen!({
    path: "../wit/compat/0.2",
    world: "plugin",
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
        }
    }
}
