//! [`Plugin`]: one compiled and pre-linked provider component, shared by every call of every
//! ProviderConfig that uses the same file content.

use std::fmt;
use std::sync::Arc;

use wasmtime::component::Component;

use super::bindings;
use super::bindings::Contract;
use super::engine::PluginEngine;
use super::exports::{self, Export};
use super::sandbox::{self, CallContext, CallError};
use super::types::{Page, PluginInfo, UpdateOutcome, VmSpec, VmStatus};

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
    pre: bindings::Pre,
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
    /// Links `component` against the host for `contract` (failing if it imports anything the
    /// host does not provide, or does not export that contract) and asks it for its `info()`.
    pub(crate) async fn prepare(
        engine: Arc<PluginEngine>,
        component: &Component,
        contract: Contract,
        digest: String,
        info_ctx: &CallContext,
    ) -> Result<Result<Self, CallError>, wasmtime::Error> {
        let instance_pre = engine.linker().instantiate_pre(component)?;
        let pre = bindings::Pre::new(contract, instance_pre)?;
        let imports = component
            .component_type()
            .imports(engine.engine())
            .map(|(name, _)| name.to_string())
            .collect();
        let info = match sandbox::call(&engine, &pre, info_ctx, exports::Info).await {
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

    /// The contract version the plugin was built against (0.2 plugins cannot `list`).
    pub fn contract(&self) -> Contract {
        self.pre.contract()
    }

    /// The component's imports (interface names), as declared in its type.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Calls `export` in a fresh, bounded Store (see [`sandbox`] for what is guaranteed).
    pub async fn call<E: Export>(
        &self,
        ctx: &CallContext,
        export: E,
    ) -> Result<E::Answer, CallError> {
        sandbox::call(&self.engine, &self.pre, ctx, export).await
    }

    /// [`Plugin::call`], also saying whether the call may have reached the cloud: `false`
    /// proves that no request left the host, so (for a `create`) no machine can have been made.
    pub async fn call_traced<E: Export>(
        &self,
        ctx: &CallContext,
        export: E,
    ) -> (Result<E::Answer, CallError>, bool) {
        sandbox::call_traced(&self.engine, &self.pre, ctx, export).await
    }

    pub async fn location(&self, ctx: &CallContext) -> Result<String, CallError> {
        self.call(ctx, exports::Location).await
    }

    pub async fn find(&self, ctx: &CallContext, uid: &str) -> Result<Option<VmStatus>, CallError> {
        self.call(
            ctx,
            exports::Find {
                uid: uid.to_owned(),
            },
        )
        .await
    }

    pub async fn create(&self, ctx: &CallContext, spec: &VmSpec) -> Result<VmStatus, CallError> {
        self.call(ctx, exports::Create { spec: spec.clone() }).await
    }

    pub async fn create_traced(
        &self,
        ctx: &CallContext,
        spec: &VmSpec,
    ) -> (Result<VmStatus, CallError>, bool) {
        self.call_traced(ctx, exports::Create { spec: spec.clone() })
            .await
    }

    pub async fn get(&self, ctx: &CallContext, id: &str) -> Result<Option<VmStatus>, CallError> {
        self.call(ctx, exports::Get { id: id.to_owned() }).await
    }

    pub async fn update(
        &self,
        ctx: &CallContext,
        id: &str,
        spec: &VmSpec,
    ) -> Result<UpdateOutcome, CallError> {
        let export = exports::Update {
            id: id.to_owned(),
            spec: spec.clone(),
        };
        self.call(ctx, export).await
    }

    pub async fn start(&self, ctx: &CallContext, id: &str) -> Result<(), CallError> {
        self.call(ctx, exports::Start { id: id.to_owned() }).await
    }

    pub async fn stop(&self, ctx: &CallContext, id: &str) -> Result<(), CallError> {
        self.call(ctx, exports::Stop { id: id.to_owned() }).await
    }

    pub async fn delete(&self, ctx: &CallContext, id: &str) -> Result<(), CallError> {
        self.call(ctx, exports::Delete { id: id.to_owned() }).await
    }

    /// One page of `list` (capability `list`): `cursor` is `None` for the first page.
    pub async fn list(&self, ctx: &CallContext, cursor: Option<&str>) -> Result<Page, CallError> {
        let cursor = cursor.map(str::to_owned);
        self.call(ctx, exports::List { cursor }).await
    }
}
