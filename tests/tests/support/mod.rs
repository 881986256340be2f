//! Shared by the security tests (the `sandbox` binary) and the provider tests (`providers`): a
//! loopback HTTP recorder, a plugin registry over the test guests, and a call context built by
//! the operator's own credentials step.

// Each of the two binaries uses only part of it.
#![allow(dead_code)]

pub mod recorder;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vmop::api::{
    CredentialsMode, Limits, PluginSource, ProviderConfig, ProviderConfigSpec, SecretRef,
};
use vmop::controller::provider_config::apply_credentials;
use vmop::plugin::{
    CallContext, CallLimits, EgressPolicy, EngineConfig, Plugin, PluginEngine, PluginRegistry,
    ProviderSettings, RegistryConfig,
};

/// `guest` (a built test guest or provider, by crate name with `_`) loaded through a registry.
pub async fn load(guest: &str) -> anyhow::Result<(tempfile::TempDir, Arc<Plugin>)> {
    let dir = tempfile::tempdir()?;
    std::fs::copy(vmop_tests::wasm::path(guest)?, dir.path().join("p.wasm"))?;
    let engine = PluginEngine::new(&EngineConfig {
        max_instances: 8,
        ..EngineConfig::default()
    })?;
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: dir.path().to_path_buf(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        },
    )?;
    let plugin = registry.load(Path::new("p.wasm"), None).await?;
    Ok((dir, plugin))
}

/// The call context the operator would build for a ProviderConfig with these settings,
/// `allowedHosts`, credentials mode and Secret (`apply_credentials` is the operator's step).
pub fn context(
    settings: &[(&str, &str)],
    allowed: &[String],
    mode: CredentialsMode,
    secret: &[(&str, &str)],
) -> anyhow::Result<CallContext> {
    let settings: BTreeMap<String, String> = settings
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let secret: BTreeMap<String, String> = secret
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let config = ProviderConfig::new(
        "security-test",
        ProviderConfigSpec {
            plugin: PluginSource {
                path: "p.wasm".into(),
                sha256: None,
            },
            config: settings.clone(),
            credentials_secret_ref: Some(SecretRef {
                namespace: "ops".into(),
                name: "creds".into(),
            }),
            credentials: mode,
            allowed_hosts: allowed.to_vec(),
            allow_private_networks: false,
            limits: Limits::default(),
            orphan_policy: Default::default(),
        },
    );
    let (secrets, egress) = apply_credentials(&config, secret, EgressPolicy::parse(allowed)?)?;
    Ok(CallContext {
        settings: ProviderSettings {
            settings,
            secrets,
            cluster: "vmop-tests".to_owned(),
        },
        egress,
        limits: CallLimits {
            timeout: Duration::from_secs(20),
            ..CallLimits::default()
        },
        label: "security-test".into(),
    })
}

/// The status message of a `get`, or the error's text.
pub async fn attempt(plugin: &Plugin, ctx: &CallContext) -> String {
    match plugin.get(ctx, "vm-1").await {
        Ok(status) => status.and_then(|s| s.message).unwrap_or_default(),
        Err(e) => format!("error: {e}"),
    }
}
