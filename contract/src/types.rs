//! Host-side types of the plugin contract (`wit/provider.wit`), independent of wasmtime.
//!
//! The reconcilers work with these; `bindings.rs` converts at the edge so that nothing outside
//! `vmop-runtime` sees generated types.

use std::collections::BTreeMap;
use std::time::Duration;

/// `ProviderConfig.spec.config` plus the credentials Secret, handed to every call.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ProviderSettings {
    pub settings: BTreeMap<String, String>,
    /// Never logged: `Debug` prints only the keys.
    pub secrets: BTreeMap<String, String>,
    /// This cluster's identity (`provider-config.cluster`): the mark `create` puts on machines
    /// and `list` filters by. Empty only where no cluster is involved (the CLI's one-off calls).
    pub cluster: String,
}

impl std::fmt::Debug for ProviderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSettings")
            .field("settings", &self.settings)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// The desired machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub name: String,
    pub namespace: String,
    /// The VirtualMachine's UID: `create` is idempotent on it.
    pub uid: String,
    pub image: String,
    pub cpu: u32,
    pub memory_mib: u64,
    pub user_data: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// `spec.parameters`, already checked against [`PluginInfo::parameters`].
    pub parameters: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Provisioning,
    Running,
    Stopped,
    Failed,
    Deleting,
    Unknown,
}

impl Phase {
    /// The spelling used in `VirtualMachine.status.phase` and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Running => "Running",
            Phase::Stopped => "Stopped",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
            Phase::Unknown => "Unknown",
        }
    }
}

/// The machine as the cloud reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmStatus {
    pub id: String,
    pub phase: Phase,
    pub addresses: Vec<String>,
    pub message: Option<String>,
    /// The uid of the VirtualMachine whose ownership mark the machine carries (`None`: not
    /// marked). [`VmStatus::owned_by_other`] is what the decision reads.
    pub owner: Option<String>,
}

impl VmStatus {
    /// Whether the machine carries another VirtualMachine's mark than `uid`'s (an unmarked
    /// machine is nobody's).
    pub fn owned_by_other(&self, uid: &str) -> bool {
        self.owner.as_deref().is_some_and(|o| o != uid)
    }
}

/// One machine of a `list` page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMachine {
    pub status: VmStatus,
    /// The cluster mark the machine carries.
    pub cluster: Option<String>,
    /// When the cloud made it, in milliseconds since the Unix epoch, where the cloud says.
    pub created_at_ms: Option<u64>,
}

/// One page of `list`: its machines and the cursor of the next page (`None` on the last).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub machines: Vec<ListedMachine>,
    pub next: Option<String>,
}

/// What a plugin's `info()` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub wit_version: String,
    pub capabilities: Vec<String>,
    /// What `vm-spec.parameters` may carry.
    pub parameters: Vec<Parameter>,
}

impl PluginInfo {
    /// Whether the plugin declares `capability` (`update`, `power`, `replace`, ...).
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// One parameter a plugin accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub kind: ParameterKind,
    pub description: String,
    /// Whether `update` applies a change to an existing machine; `false`: launch-only.
    pub mutable: bool,
}

/// The kind of a parameter's value (every value travels as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParameterKind {
    Text,
    Integer,
    Boolean,
    StringList,
}

impl ParameterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ParameterKind::Text => "text",
            ParameterKind::Integer => "integer",
            ParameterKind::Boolean => "boolean",
            ParameterKind::StringList => "string-list",
        }
    }
}

/// What `update` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOutcome {
    Applied,
    NeedsRestart,
    NeedsReplacement,
}

/// An error the provider itself reported (the guest returned `err(...)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("transient provider error: {0}")]
    Transient(String),
    #[error("rate limited by the cloud (retry after {retry_after:?}): {message}")]
    RateLimited {
        retry_after: Duration,
        message: String,
    },
    #[error("permanent provider error: {0}")]
    Permanent(String),
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    #[error("unauthorized: {0}")]
    Unauthorized(String),
}

/// Which operation a call performed; a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Info,
    Location,
    Find,
    Create,
    Get,
    Update,
    Start,
    Stop,
    Delete,
    List,
}

impl Operation {
    pub const ALL: [Operation; 10] = [
        Operation::Info,
        Operation::Location,
        Operation::Find,
        Operation::Create,
        Operation::Get,
        Operation::Update,
        Operation::Start,
        Operation::Stop,
        Operation::Delete,
        Operation::List,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Info => "info",
            Operation::Location => "location",
            Operation::Find => "find",
            Operation::Create => "create",
            Operation::Get => "get",
            Operation::Update => "update",
            Operation::Start => "start",
            Operation::Stop => "stop",
            Operation::Delete => "delete",
            Operation::List => "list",
        }
    }

    /// Whether the call can change anything at the cloud (`vmop plan` makes none of these).
    pub fn writes(self) -> bool {
        matches!(
            self,
            Operation::Create
                | Operation::Update
                | Operation::Start
                | Operation::Stop
                | Operation::Delete
        )
    }
}

/// What the host should do after a failed call. Every call error maps to exactly one class;
/// the controller's error policy and the `Synced` condition's reason are derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry with per-object exponential backoff.
    Transient,
    /// Retry after the given delay.
    RateLimited(Duration),
    /// No retry until the VM, its ProviderConfig or its Secret changes.
    Permanent,
    InvalidSpec,
    Unauthorized,
}

impl ErrorClass {
    /// The `Synced` condition reason and bounded metric label for this class.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorClass::Transient => "TransientError",
            ErrorClass::RateLimited(_) => "RateLimited",
            ErrorClass::Permanent => "PermanentError",
            ErrorClass::InvalidSpec => "InvalidSpec",
            ErrorClass::Unauthorized => "Unauthorized",
        }
    }
}

/// Who is at fault for a failed call, so conditions and metrics can tell a cloud outage from a
/// plugin bug from an operator bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The provider reported an error from the cloud (or about the spec/credentials).
    Provider,
    /// The guest misbehaved: trap, deadline, memory cap, contract violation.
    Plugin,
    /// The host failed (instantiation, resource exhaustion, internal error).
    Host,
}

impl From<&ProviderError> for ErrorClass {
    fn from(e: &ProviderError) -> Self {
        match e {
            ProviderError::Transient(_) => ErrorClass::Transient,
            ProviderError::RateLimited { retry_after, .. } => ErrorClass::RateLimited(*retry_after),
            ProviderError::Permanent(_) => ErrorClass::Permanent,
            ProviderError::InvalidSpec(_) => ErrorClass::InvalidSpec,
            ProviderError::Unauthorized(_) => ErrorClass::Unauthorized,
        }
    }
}
