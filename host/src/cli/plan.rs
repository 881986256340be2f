//! `vmop plan`: a dry run. For every VirtualMachine in the cluster (or one namespace, or a
//! manifest not yet applied), what the operator would do next and why, from read-only plugin
//! calls through the plugins in `--plugin-dir`. Exit code 0 when nothing would change, 2 when
//! something would (for CI gates).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use serde::Deserialize;

use crate::api::{ProviderConfig, VirtualMachine};
use crate::controller::provider_config::Resolver;
use crate::controller::runtime::limiter::Limiters;
use crate::controller::vm::plan::{PlanRow, orphan_rows, plan};
use vmop_runtime::{
    CallLimits, Connections, EngineConfig, PluginEngine, PluginRegistry, RegistryConfig,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Only VirtualMachines in this namespace (default: all namespaces).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Plan the VirtualMachines of this manifest (YAML, several documents allowed) instead of
    /// the cluster's; objects already in the cluster are planned with their live status.
    #[arg(long, short = 'f')]
    filename: Option<PathBuf>,
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Directory of the plugin files the ProviderConfigs name (the operator's plugin volume).
    #[arg(long, env = "VMOP_PLUGIN_DIR", default_value = "/plugins")]
    plugin_dir: PathBuf,
    /// The operator's namespace, where the credentials Secrets live.
    #[arg(long, env = "POD_NAMESPACE")]
    operator_namespace: Option<String>,
    /// This cluster's identity, as the operator's `--cluster-id` (default: the uid of
    /// namespace `kube-system`).
    #[arg(long, env = "VMOP_CLUSTER_ID")]
    cluster_id: Option<String>,
}

/// The plan found changes: `main` exits with 2.
#[derive(Debug, thiserror::Error)]
#[error("{0} VirtualMachine(s) would change")]
pub struct Changes(pub usize);

pub async fn run(args: PlanArgs) -> anyhow::Result<()> {
    let client = super::kube_client().await?;
    let operator_namespace = args
        .operator_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let engine = PluginEngine::new(&EngineConfig::default())?;
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: args.plugin_dir.clone(),
            cache_dir: None,
            info_limits: CallLimits::default(),
        },
    )
    .with_context(|| {
        format!(
            "failed to open the plugin directory {}",
            args.plugin_dir.display()
        )
    })?;
    let configs = Api::<ProviderConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("failed to list ProviderConfigs")?
        .items;
    let secrets = Api::<Secret>::namespaced(client.clone(), &operator_namespace)
        .list(&ListParams::default())
        .await
        .context("failed to list the Secrets of the operator namespace")?
        .items;
    let resolver = Resolver {
        configs: store_of(configs),
        secrets: store_of(secrets),
        registry,
        limiters: Limiters::default(),
        connections: Connections::default(),
        operator_namespace,
        cluster_id: super::cluster_id(&client, args.cluster_id.as_deref()).await?,
    };
    let cluster = {
        let api: Api<VirtualMachine> = match &args.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        api.list(&ListParams::default())
            .await
            .context("failed to list VirtualMachines")?
            .items
    };
    let vms = match &args.filename {
        Some(path) => from_manifest(&client, path).await?,
        None => cluster.clone(),
    };
    let mut rows = Vec::with_capacity(vms.len());
    for vm in &vms {
        rows.push(plan(&resolver, vm, &cluster).await);
    }
    // Orphans are judged against every VM of the cluster: not for one namespace or a manifest.
    if args.namespace.is_none() && args.filename.is_none() {
        let uids = cluster
            .iter()
            .filter_map(|vm| vm.metadata.uid.clone())
            .collect();
        rows.extend(orphan_rows(&resolver, &uids).await);
    }
    print(&rows, args.output)?;
    match rows.iter().filter(|r| r.changes()).count() {
        0 => Ok(()),
        n => Err(Changes(n).into()),
    }
}

fn store_of<K>(objects: Vec<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + reflector::Lookup<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    for object in objects {
        writer.apply_watcher_event(&Event::Apply(object));
    }
    reader
}

/// The manifest's VMs, each replaced by the live object of the same name when there is one
/// (with the manifest's spec, as applying it would).
async fn from_manifest(
    client: &kube::Client,
    path: &std::path::Path,
) -> anyhow::Result<Vec<VirtualMachine>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let mut out = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(document)
            .with_context(|| format!("{} is not YAML", path.display()))?;
        if value.get("kind").and_then(|k| k.as_str()) != Some("VirtualMachine") {
            continue;
        }
        let mut vm: VirtualMachine = serde_json::from_value(value)
            .with_context(|| format!("a VirtualMachine in {} is invalid", path.display()))?;
        let namespace = vm
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let api: Api<VirtualMachine> = Api::namespaced(client.clone(), &namespace);
        let name = vm.metadata.name.clone().unwrap_or_default();
        if let Some(live) = api
            .get_opt(&name)
            .await
            .context("failed to read a VirtualMachine")?
        {
            vm.metadata = live.metadata;
            vm.status = live.status;
        } else {
            vm.metadata.namespace = Some(namespace);
        }
        out.push(vm);
    }
    Ok(out)
}

fn print(rows: &[PlanRow], output: Output) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut out, rows)?;
            writeln!(out)?;
        }
        Output::Table => {
            let width = |f: fn(&PlanRow) -> &str, title: &str| {
                rows.iter()
                    .map(|r| f(r).len())
                    .chain([title.len()])
                    .max()
                    .unwrap_or(0)
            };
            let (wn, wm, wp, wa) = (
                width(|r| &r.namespace, "NAMESPACE"),
                width(|r| &r.name, "NAME"),
                width(|r| &r.provider, "PROVIDER"),
                width(|r| &r.action, "ACTION"),
            );
            writeln!(
                out,
                "{:wn$}   {:wm$}   {:wp$}   {:wa$}   WHY",
                "NAMESPACE", "NAME", "PROVIDER", "ACTION"
            )?;
            for r in rows {
                writeln!(
                    out,
                    "{:wn$}   {:wm$}   {:wp$}   {:wa$}   {}",
                    r.namespace, r.name, r.provider, r.action, r.reason
                )?;
            }
        }
    }
    Ok(())
}
