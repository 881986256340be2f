//! [`Plugin`]: one compiled and pre-linked provider component, shared by every call of every
//! ProviderConfig that uses the same file content.

use std::fmt;
use std::sync::Arc;

use wasmtime::component::Component;

use super::bindings::{self, ProviderConfig};
use super::engine::PluginEngine;
use super::sandbox::{self, CallContext, CallError};
use super::state::State;
use super::types::{PluginInfo, UpdateOutcome, VmSpec, VmStatus};

/// The interface a plugin exports, without its version.
const PROVIDER_EXPORT: &str = "vmop:provider/provider@";

/// The version of `vmop:provider/provider` a component exports, read from its type before it
/// is linked, so that a plugin built for another contract is refused naming both versions
/// rather than failing to link.
pub(crate) fn exported_wit_version(engine: &PluginEngine, component: &Component) -> Option<String> {
    component
        .component_type()
        .exports(engine.engine())
        .find_map(|(name, _)| name.strip_prefix(PROVIDER_EXPORT).map(str::to_owned))
}

/// A loaded plugin: one per digest, pre-instantiated once. Calls run in fresh Stores (see
/// [`sandbox`]), so a `Plugin` is freely shared across tasks; replacing the file makes a new
/// `Plugin` while calls holding this one finish on it.
pub struct Plugin {
    digest: String,
    info: PluginInfo,
    imports: Vec<String>,
    pre: bindings::PluginPre<State>,
    engine: Arc<PluginEngine>,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("digest", &self.digest)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// Links `component` against the host (failing if it imports anything the host does not
    /// provide) and asks it for its `info()`.
    pub(crate) async fn prepare(
        engine: Arc<PluginEngine>,
        component: &Component,
        digest: String,
        info_ctx: &CallContext,
    ) -> Result<Result<Self, CallError>, wasmtime::Error> {
        let instance_pre = engine.linker().instantiate_pre(component)?;
        let pre = bindings::PluginPre::new(instance_pre)?;
        let imports = component
            .component_type()
            .imports(engine.engine())
            .map(|(name, _)| name.to_string())
            .collect();
        let info = match sandbox::call(&engine, &pre, info_ctx, sandbox::Info).await {
            Ok(info) => info,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(Plugin {
            digest,
            info,
            imports,
            pre,
            engine,
        }))
    }

    /// The sha256 of the file, lowercase hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// What `info()` returned when the plugin was loaded.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The component's imports (interface names), as declared in its type.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    pub async fn location(&self, ctx: &CallContext) -> Result<String, CallError> {
        let export = sandbox::Location {
            config: ProviderConfig::from(&ctx.settings),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }

    pub async fn find(&self, ctx: &CallContext, uid: &str) -> Result<Option<VmStatus>, CallError> {
        let export = sandbox::Find {
            config: ProviderConfig::from(&ctx.settings),
            uid: uid.to_owned(),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }

    pub async fn create(&self, ctx: &CallContext, spec: &VmSpec) -> Result<VmStatus, CallError> {
        self.create_traced(ctx, spec).await.0
    }

    /// `create`, also saying whether the call may have reached the cloud: `false` proves that
    /// no request left the host, so no machine can have been made.
    pub async fn create_traced(
        &self,
        ctx: &CallContext,
        spec: &VmSpec,
    ) -> (Result<VmStatus, CallError>, bool) {
        let export = sandbox::Create {
            config: ProviderConfig::from(&ctx.settings),
            spec: spec.into(),
        };
        let (result, reached) = sandbox::call_traced(&self.engine, &self.pre, ctx, export).await;
        let result = match result {
            Ok(answer) => answer.map_err(CallError::from),
            Err(e) => Err(e),
        };
        (result, reached)
    }

    pub async fn get(&self, ctx: &CallContext, id: &str) -> Result<Option<VmStatus>, CallError> {
        let export = sandbox::Get {
            config: ProviderConfig::from(&ctx.settings),
            id: id.to_owned(),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }

    pub async fn update(
        &self,
        ctx: &CallContext,
        id: &str,
        spec: &VmSpec,
    ) -> Result<UpdateOutcome, CallError> {
        let export = sandbox::Update {
            config: ProviderConfig::from(&ctx.settings),
            id: id.to_owned(),
            spec: spec.into(),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }

    pub async fn start(&self, ctx: &CallContext, id: &str) -> Result<(), CallError> {
        let export = sandbox::Start {
            config: ProviderConfig::from(&ctx.settings),
            id: id.to_owned(),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }

    pub async fn stop(&self, ctx: &CallContext, id: &str) -> Result<(), CallError> {
        let export = sandbox::Stop {
            config: ProviderConfig::from(&ctx.settings),
            id: id.to_owned(),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }

    pub async fn delete(&self, ctx: &CallContext, id: &str) -> Result<(), CallError> {
        let export = sandbox::Delete {
            config: ProviderConfig::from(&ctx.settings),
            id: id.to_owned(),
        };
        Ok(sandbox::call(&self.engine, &self.pre, ctx, export).await??)
    }
}
