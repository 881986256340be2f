//! `ProviderConfig`: which plugin to run for a cloud, with which settings, credentials, network
//! allowlist and limits. Cluster-scoped; VirtualMachines reference it by name.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How to reach one cloud account through one provider plugin.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
// Several `printcolumn(type_ = ..)` are several columns, not a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "vmop.dev",
    version = "v1alpha1",
    kind = "ProviderConfig",
    shortname = "vmpc",
    category = "vmop",
    status = "ProviderConfigStatus",
    derive = "PartialEq",
    doc = "A provider plugin and the settings, credentials, network allowlist and limits it runs with.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Plugin", type_ = "string", json_path = ".status.plugin.name"),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.plugin.version"
    ),
    printcolumn(name = "VMs", type_ = "integer", json_path = ".status.vmCount"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfigSpec {
    /// The plugin file and, optionally, the digest it must have.
    pub plugin: PluginSource,

    /// Settings handed to every plugin call (region, endpoint, ...). Their meaning is defined by
    /// the plugin. Not secret: visible to anyone who can read this object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,

    /// The Secret holding this cloud account's credentials. It must live in the operator's own
    /// namespace, the only namespace where the operator may read Secrets. Its values are never
    /// logged nor copied into status or events, and are redacted from everything the plugin
    /// says. How it is used is `credentials`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,

    /// How the credentials Secret is used. `aws-sigv4` (default), `bearer` and `header`: the
    /// operator authenticates every allowed request itself and the plugin never receives a
    /// secret value. `aws-sigv4` signs with the keys `access_key_id`, `secret_access_key` and
    /// optional `session_token`, for the service and region the plugin names per request or the
    /// endpoint's (`<service>.<region>.amazonaws.com`), else for settings `region` and
    /// `signingService` (default `ec2`); `bearer` sends `Authorization: Bearer <token>` from key
    /// `token`; `header` sends key `token` in the header named by setting `credentialsHeader`.
    /// Headers the plugin sets under those names are replaced. `passthrough` hands every key
    /// to the plugin instead (contract 0.1 behaviour): an explicit opt-in, reported in status
    /// and by an Event.
    #[serde(default)]
    pub credentials: CredentialsMode,

    /// Outbound HTTP destinations the plugin may call: `scheme://host:port` (e.g.
    /// `https://ec2.eu-west-1.amazonaws.com:443`) or a host wildcard `*.amazonaws.com`. Empty
    /// means no network at all. Everything not listed is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 512)))]
    pub allowed_hosts: Vec<String>,

    /// Let allowed names resolve to loopback, link-local (cloud metadata), private and other
    /// non-public addresses. Off by default: an allowed name answering 127.0.0.1 or
    /// 169.254.169.254 is refused, unless `allowedHosts` names that address literally. For
    /// test clouds on loopback or a private network.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private_networks: bool,

    /// Bounds on every plugin call made for this ProviderConfig.
    #[serde(default)]
    pub limits: Limits,

    /// What to do with orphans: machines in this ProviderConfig's account that carry this
    /// cluster's mark and the uid of a VirtualMachine that no longer exists (found by plugins
    /// with capability `list`). `Report` (default) counts them in `status.orphans`, the metric
    /// `vmop_orphans` and an Event; `Delete` also deletes each one seen in two listings in a row
    /// and made longer ago than the creation grace period. Another cluster's machines, and
    /// machines without vmop's marks, are never touched.
    #[serde(default)]
    pub orphan_policy: OrphanPolicy,
}

/// `spec.orphanPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OrphanPolicy {
    #[default]
    Report,
    Delete,
}

/// How the credentials Secret is used (see `spec.credentials`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CredentialsMode {
    /// The operator signs each allowed request with AWS Signature Version 4.
    #[default]
    #[serde(rename = "aws-sigv4")]
    AwsSigV4,
    /// The operator adds `Authorization: Bearer <token>`.
    #[serde(rename = "bearer")]
    Bearer,
    /// The operator adds the header named by setting `credentialsHeader`.
    #[serde(rename = "header")]
    Header,
    /// Every key is handed to the plugin as secret config.
    #[serde(rename = "passthrough")]
    Passthrough,
}

impl CredentialsMode {
    /// The spelling in `spec.credentials`.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialsMode::AwsSigV4 => "aws-sigv4",
            CredentialsMode::Bearer => "bearer",
            CredentialsMode::Header => "header",
            CredentialsMode::Passthrough => "passthrough",
        }
    }

    /// Whether the plugin receives the secret values.
    pub fn is_passthrough(self) -> bool {
        self == CredentialsMode::Passthrough
    }
}

/// Where the plugin comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PluginSource {
    /// Path of the `.wasm` component relative to the operator's plugin directory
    /// (`--plugin-dir`, default `/plugins`), e.g. `ec2.wasm`. No absolute paths, no `..`.
    #[schemars(
        length(min = 1, max = 255),
        regex(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$")
    )]
    pub path: String,

    /// Optional pin: the lowercase hex SHA-256 of the plugin file. On a mismatch the plugin is
    /// not loaded, no call is made and the `Ready` condition says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
}

/// A Secret in a given namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretRef {
    /// Namespace of the Secret: must be the operator's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Per-ProviderConfig call limits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Wall-clock limit of one plugin call, in seconds.
    #[serde(default = "defaults::call_timeout_seconds")]
    #[schemars(range(min = 1, max = 600), transform = super::int32)]
    pub call_timeout_seconds: u32,

    /// Memory limit of one plugin instance, in MiB.
    #[serde(default = "defaults::memory_mib", rename = "memoryMiB")]
    #[schemars(range(min = 1, max = 4096), transform = super::int32)]
    pub memory_mib: u32,

    /// Sustained rate of plugin calls per second, across all VirtualMachines using this
    /// ProviderConfig (token bucket refill rate).
    #[serde(default = "defaults::requests_per_second")]
    #[schemars(range(min = 1, max = 10000), transform = super::int32)]
    pub requests_per_second: u32,

    /// Calls that may be made at once above the sustained rate (token bucket size).
    #[serde(default = "defaults::burst")]
    #[schemars(range(min = 1, max = 10000), transform = super::int32)]
    pub burst: u32,

    /// Sustained rate of calls that change machines (create, update, start, stop, delete).
    /// Clouds throttle these on a bucket of their own (EC2: 5 a second) that reads do not
    /// draw on, and they draw on nothing else; set, this paces them the same way: they take
    /// no part of `requestsPerSecond`, which then paces the other calls only, and a throttle
    /// answer to one halves this rate only. Unset: they share `requestsPerSecond` with the
    /// reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000), transform = super::int32)]
    pub mutating_requests_per_second: Option<u32>,

    /// Calls that change machines that may be made at once above their sustained rate
    /// (default: `mutatingRequestsPerSecond`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000), transform = super::int32)]
    pub mutating_burst: Option<u32>,

    /// Plugin calls in flight at the same time for this ProviderConfig.
    #[serde(default = "defaults::max_concurrent_calls")]
    #[schemars(range(min = 1, max = 1024), transform = super::int32)]
    pub max_concurrent_calls: u32,

    /// How long after a create the cloud may still answer that the machine does not exist
    /// (read-after-write lag), in seconds. Until it has passed, "not found" is not taken as
    /// "lost" (recreate) nor as "gone" (release the finalizer).
    #[serde(default = "defaults::creation_grace_period_seconds")]
    #[schemars(range(min = 0, max = 3600), transform = super::int32)]
    pub creation_grace_period_seconds: u32,
}

mod defaults {
    pub fn call_timeout_seconds() -> u32 {
        30
    }
    pub fn memory_mib() -> u32 {
        64
    }
    pub fn requests_per_second() -> u32 {
        10
    }
    pub fn burst() -> u32 {
        20
    }
    pub fn max_concurrent_calls() -> u32 {
        8
    }
    pub fn creation_grace_period_seconds() -> u32 {
        30
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            call_timeout_seconds: defaults::call_timeout_seconds(),
            memory_mib: defaults::memory_mib(),
            requests_per_second: defaults::requests_per_second(),
            burst: defaults::burst(),
            mutating_requests_per_second: None,
            mutating_burst: None,
            max_concurrent_calls: defaults::max_concurrent_calls(),
            creation_grace_period_seconds: defaults::creation_grace_period_seconds(),
        }
    }
}

/// What the operator observed about this ProviderConfig.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfigStatus {
    /// `Ready`: the plugin is loaded (and matches its pin) and the credentials Secret resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// What the loaded plugin reported about itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginStatus>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// How the credentials Secret is used, as last resolved; `passthrough` means the plugin
    /// holds the secret values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsMode>,

    /// Number of VirtualMachines referencing this ProviderConfig.
    #[serde(default)]
    #[schemars(transform = super::int32)]
    pub vm_count: u32,

    /// Machines the last complete listing of the cloud found with this cluster's mark and no
    /// VirtualMachine (plugins with capability `list` only; see `spec.orphanPolicy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::int32)]
    pub orphans: Option<u32>,
}

/// The loaded plugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginStatus {
    /// Provider name the plugin reports, e.g. `ec2`.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// Lowercase hex SHA-256 of the plugin file that is loaded.
    pub digest: String,
    /// Version of the `vmop:provider` WIT package the plugin was built against.
    pub wit_version: String,
    /// Optional behaviours the plugin supports: `update` (resize), `power` (start/stop),
    /// `replace`, `user-data`. The operator never asks for one that is missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// What a VirtualMachine's `spec.parameters` may carry for this plugin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<ParameterStatus>,
}

/// One parameter the plugin accepts in a VirtualMachine's `spec.parameters`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ParameterStatus {
    /// The parameter's name (the key in `spec.parameters`).
    pub name: String,
    /// `text`, `integer`, `boolean` or `string-list` (a list of strings, or comma-separated).
    pub kind: String,
    /// What the parameter does, in the plugin's words.
    pub description: String,
    /// Whether a change reaches an existing machine; `false`: it takes effect at creation
    /// only, and a change afterwards is refused (`Synced=False`, reason `InvalidSpec`).
    #[serde(default)]
    pub mutable: bool,
}
