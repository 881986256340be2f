//! `VirtualMachine`: a machine on an external cloud, created and observed through the plugin
//! of the `ProviderConfig` it names.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use vmop_runtime::Phase;

/// The desired machine. Fields the provider cannot change on an existing machine (image, user
/// data, provider) are immutable: replace the VirtualMachine to change them (the operator never
/// replaces a machine itself). cpu, memory, parameters and powerState may change (see
/// `spec.updateStrategy`), except parameters the plugin declares launch-only.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
// Several `printcolumn(type_ = ..)` are several columns, not a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "vmop.dev",
    version = "v1alpha1",
    kind = "VirtualMachine",
    namespaced,
    shortname = "vm",
    category = "vmop",
    status = "VirtualMachineStatus",
    derive = "PartialEq",
    doc = "A virtual machine on an external cloud, managed through the provider plugin of a ProviderConfig.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase as the provider reports it"
    ),
    printcolumn(
        name = "ID",
        type_ = "string",
        json_path = ".status.id",
        description = "The cloud's identifier of the machine"
    ),
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".spec.providerConfigRef.name",
        description = "The ProviderConfig managing the machine"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "has(self.userData) == has(oldSelf.userData) && (!has(self.userData) || self.userData == oldSelf.userData)"
).message("userData is immutable: the provider cannot change the user data of an existing machine; create a new VirtualMachine instead").field_path(".userData"))]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// The cluster-scoped ProviderConfig whose plugin creates and manages this machine.
    /// Immutable: moving a machine between providers is not supported.
    #[x_kube(validation = Rule::new("self == oldSelf").message("providerConfigRef is immutable: a machine cannot move to another provider; create a new VirtualMachine instead"))]
    pub provider_config_ref: ProviderConfigRef,

    /// The machine image, in the provider's terms (for EC2 an AMI id such as `ami-0abc...`).
    /// Immutable.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("image is immutable: the provider cannot change the image of an existing machine; create a new VirtualMachine instead"))]
    pub image: String,

    /// Number of virtual CPUs, at least 1. The provider picks the smallest machine type with at
    /// least this many CPUs and this much memory. May change: the operator resizes the machine
    /// through the provider's `update` (see `updateStrategy`).
    #[schemars(range(min = 1, max = 1024), transform = super::int32)]
    pub cpu: u32,

    /// Memory as a Kubernetes quantity, e.g. `4Gi`, `512Mi` or `1.5Gi`; at least `1Mi`.
    /// Decimal units are rounded up to whole MiB (`1G` is 954 MiB). May change, like `cpu`.
    #[schemars(schema_with = "memory_schema")]
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Mi')) >= 0").message("memory must be a Kubernetes quantity of at least 1Mi, e.g. 4Gi, 512Mi or 1.5Gi"))]
    pub memory: Quantity,

    /// Data handed to the machine at first boot (e.g. a cloud-init document), as plain text.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub user_data: Option<String>,

    /// What happens to the external machine when this VirtualMachine is deleted: `Delete`
    /// (default) deletes it through the provider before the object goes away; `Orphan` leaves
    /// it running and only removes the object.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// When set, the operator maintains a ConfigMap of this name in the VirtualMachine's
    /// namespace holding `id`, `phase` and `addresses`, for workloads that need to find the
    /// machine. The ConfigMap is owned by the VirtualMachine and deleted with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_config_map: Option<ConnectionConfigMap>,

    /// Accepts a move of the ProviderConfig to another location (account, region or
    /// endpoint). When the ProviderConfig's location differs from `status.location`, the
    /// operator never takes "not found" as "lost" or "gone": the VM shows `Synced=False` with
    /// reason `LocationChanged` until the ProviderConfig is reverted or this field is set to the
    /// new location (as the condition message names it). Then the machine at the old location
    /// is left alone and no longer managed, and a new one is created at the new location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub accept_location: Option<String>,

    /// Provider-specific settings of this machine, overriding the ProviderConfig's
    /// `spec.config` entry of the same name (for EC2: `instanceType`, `subnetId`,
    /// `securityGroupIds`, `keyName`, `rootVolumeSizeGiB`, `tags`). The names and kinds the
    /// plugin accepts are listed in the ProviderConfig's `status.plugin.parameters`; a value is
    /// a string, a number, a boolean, or (for `string-list` parameters) a list of strings or a
    /// comma-separated string. An unknown name or a value of the wrong kind is refused before
    /// any call to the cloud (`Synced=False`, reason `InvalidSpec`, naming the parameter). So is
    /// a change, after the machine was created, of a parameter the plugin applies at creation
    /// only (`mutable: false` in that list; for EC2 all but `instanceType`): the machine and
    /// `status.applied` keep the value it was made with until the change is reverted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "parameters_schema")]
    pub parameters: BTreeMap<String, serde_json::Value>,

    /// Whether the machine should run: `Running` (default) or `Stopped`. The operator starts or
    /// stops it through the provider (which must declare the `power` capability) and records
    /// each transition as an Event; drift correction keeps it in this state.
    #[serde(default)]
    pub power_state: PowerState,

    /// How a change of cpu, memory or parameters that the provider can only apply to a stopped
    /// machine is carried out: `Manual` (default) leaves the machine running and sets
    /// `RestartRequired=True` until it is restarted (set `powerState: Stopped`, then `Running`)
    /// or this field becomes `Restart`; `Restart` stops the machine, applies the change and
    /// starts it again.
    #[serde(default)]
    pub update_strategy: UpdateStrategy,

    /// Adopt an existing machine instead of creating one: the cloud's identifier of it (for EC2
    /// an instance id). Only read while no machine is recorded in `status.id`. The operator
    /// checks that the machine exists and that no other VirtualMachine manages it: none in the
    /// cluster records it, and its ownership mark at the cloud (EC2: tag `vmop.dev/uid`), if
    /// any, is this VirtualMachine's uid, even when the VirtualMachine that set it is gone. A
    /// conflict is `Synced=False` with reason `AdoptionConflict`, and the machine is not
    /// touched, nor deleted with this VirtualMachine. Under `managementPolicy: Full` the
    /// adopted machine is marked as this VirtualMachine's (EC2: tagged), so that a second one
    /// naming it is refused; if its mark later names another VirtualMachine, the operator lets
    /// it go (`AdoptionConflict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub external_id: Option<String>,

    /// What the operator may do to the machine: `Full` (default) creates, updates, powers and
    /// deletes it; `ObserveOnly` never calls create, update, start, stop or delete: it mirrors
    /// the machine's state into status, and deleting the VirtualMachine leaves the machine.
    #[serde(default)]
    pub management_policy: ManagementPolicy,
}

impl VirtualMachineSpec {
    /// A spec as a minimal manifest writes it: the ProviderConfig, image, cpu and memory (a
    /// Kubernetes quantity such as `1Gi`), everything else at its default.
    pub fn new(
        provider_config: impl Into<String>,
        image: impl Into<String>,
        cpu: u32,
        memory: impl Into<String>,
    ) -> Self {
        VirtualMachineSpec {
            provider_config_ref: ProviderConfigRef {
                name: provider_config.into(),
            },
            image: image.into(),
            cpu,
            memory: Quantity(memory.into()),
            ..Default::default()
        }
    }
}

/// `spec.powerState`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerState {
    /// The machine runs.
    #[default]
    Running,
    /// The machine is stopped (it keeps its disks and id).
    Stopped,
}

/// `spec.updateStrategy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategy {
    /// A change that needs a restart waits, with `RestartRequired=True`.
    #[default]
    Manual,
    /// A change that needs a restart is applied with stop, update, start.
    Restart,
}

/// `spec.managementPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ManagementPolicy {
    /// Create, update, power and delete the machine.
    #[default]
    Full,
    /// Only observe the machine (`get`, `find`); never change or delete it.
    ObserveOnly,
}

/// A reference to a cluster-scoped ProviderConfig.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ProviderConfigRef {
    /// Name of the ProviderConfig.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The ConfigMap that publishes how to reach the machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ConnectionConfigMap {
    /// Name of the ConfigMap, in the VirtualMachine's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What deleting a VirtualMachine does to its external machine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete the external machine, and wait until the provider confirms it is gone.
    #[default]
    Delete,
    /// Leave the external machine running.
    Orphan,
}

/// The machine as last observed through the provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// The cloud's identifier of the machine, recorded right after it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,

    /// Lifecycle phase as the provider last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<VmPhase>,

    /// Addresses of the machine, most useful first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,

    /// `Ready` (the machine is observed running), `Synced` (the last reconcile succeeded;
    /// otherwise its reason names the error class) and `RestartRequired` (a change waits for a
    /// restart, see `spec.updateStrategy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Where the machine was made, as the plugin's `location` names it (e.g. an account, region
    /// and endpoint). Recorded with `id`; a ProviderConfig now answering another location is
    /// never read as "the machine is gone" (see `spec.acceptLocation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,

    /// The class of the last failed provider call (`TransientError`, `RateLimited`,
    /// `PermanentError`, `InvalidSpec`, `Unauthorized`), cleared on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,

    /// What the machine was last made to match (cpu, memory, parameters): a spec that differs
    /// is applied through the provider's `update`. Absent while not known: an adopted machine,
    /// one created before this field existed or whose create answer was lost, or an update in
    /// flight; the next `update` settles it (a provider without `update` is taken to match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedSpec>,

    /// The value of annotation `vmop.dev/reconcile-requested-at` that the last reconcile
    /// handled: set the annotation to a new value to reconcile at once, and wait for it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
}

/// The size and parameters the machine was last made to match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedSpec {
    /// `spec.cpu` as applied.
    #[schemars(transform = super::int32)]
    pub cpu: u32,
    /// `spec.memory` as applied, in MiB.
    #[serde(rename = "memoryMiB")]
    #[schemars(transform = super::int64)]
    pub memory_mib: u64,
    /// `spec.parameters` as applied, as the text handed to the provider.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// An `update` was asked and its outcome is not recorded yet (it is asked again): the
    /// machine may have the size above or the one the spec asks. The parameters applied at
    /// launch only stay those above, so a change of one is still refused meanwhile.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// Lifecycle phase of the external machine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VmPhase {
    Pending,
    Provisioning,
    Running,
    Stopped,
    Failed,
    Deleting,
    Unknown,
}

impl From<Phase> for VmPhase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Pending => VmPhase::Pending,
            Phase::Provisioning => VmPhase::Provisioning,
            Phase::Running => VmPhase::Running,
            Phase::Stopped => VmPhase::Stopped,
            Phase::Failed => VmPhase::Failed,
            Phase::Deleting => VmPhase::Deleting,
            Phase::Unknown => VmPhase::Unknown,
        }
    }
}

impl VmPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            VmPhase::Pending => "Pending",
            VmPhase::Provisioning => "Provisioning",
            VmPhase::Running => "Running",
            VmPhase::Stopped => "Stopped",
            VmPhase::Failed => "Failed",
            VmPhase::Deleting => "Deleting",
            VmPhase::Unknown => "Unknown",
        }
    }
}

/// A `resource.Quantity`: integer or string. Validity and the 1Mi minimum are a CEL rule
/// (Kubernetes' own quantity parser), which gives a clearer message than a pattern. (controller-gen
/// adds `anyOf: [integer, string]`, which kube's structural rewrite would empty;
/// `x-kubernetes-int-or-string` alone says the same.)
fn memory_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
    })
}

/// `spec.parameters`: an object of any values (checked by the operator against the plugin's
/// declared parameters, which the API server cannot know).
fn parameters_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}
