//! What a VM's reconcile starts from: the watch predicate, the facts [`decide`](crate::controller::decide::decide) needs and the
//! spec handed to the plugin.

use std::time::Duration;

use kube::{Resource, ResourceExt};

use super::day2;
use crate::api::parameters;
use crate::api::quantity::to_mib;
use crate::api::{CREATE_LOCATION, PAUSED, POLL_INTERVAL, RECONCILE_REQUESTED_AT, VirtualMachine};
use crate::controller::attempts::Attempts;
use crate::controller::decide::Facts;
use crate::controller::error::Error;
use crate::plugin::{PluginInfo, VmSpec};

/// The watch predicate of VirtualMachines: a reconcile is triggered when this changes, that is
/// when the generation (spec, deletion) or one of the annotations a user sets to steer the
/// operator (`vmop.dev/paused`, `vmop.dev/reconcile-requested-at`, `vmop.dev/poll-interval`)
/// changes; not on the operator's own writes (status, finalizer, create location).
/// Test: `tests/tests/operator_day2_pause.rs`.
pub fn trigger_key(vm: &VirtualMachine) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    vm.meta().generation.hash(&mut h);
    for key in [PAUSED, RECONCILE_REQUESTED_AT, POLL_INTERVAL] {
        vm.annotations().get(key).hash(&mut h);
    }
    Some(h.finish())
}

/// What [`decide`](crate::controller::decide::decide) needs: the object, what `attempts` knows with the ProviderConfig's
/// creation grace period, and the plugin with the spec it is handed (`None` before the
/// ProviderConfig is resolved: no capability, nothing desired).
pub fn facts(
    vm: &VirtualMachine,
    attempts: &Attempts,
    grace: Duration,
    plugin: Option<(&PluginInfo, &VmSpec)>,
) -> Facts {
    let status = vm.status.as_ref();
    let uid = vm.meta().uid.as_deref().unwrap_or_default();
    Facts {
        deleting: vm.meta().deletion_timestamp.is_some(),
        deletion_policy: vm.spec.deletion_policy,
        id: status.and_then(|s| s.id.clone()),
        recorded_location: status.and_then(|s| s.location.clone()),
        // What this process itself attempted beats an annotation the informer may show from
        // before its own writes.
        intended_location: attempts
            .reached_location(uid)
            .or_else(|| vm.annotations().get(CREATE_LOCATION).cloned()),
        accept_location: vm.spec.accept_location.clone(),
        absence_wait: attempts.absence_wait(uid, grace),
        never_created: attempts.never_created(uid),
        sole_machine: attempts.sole_machine(uid),
        day2: day2::facts(vm, plugin),
    }
}

/// The spec handed to the plugin, its `spec.parameters` checked against what `plugin`
/// declares (an unknown or ill-typed one is [`Error::Parameters`], before any call).
pub fn vm_spec(vm: &VirtualMachine, plugin: &PluginInfo) -> Result<VmSpec, Error> {
    let parameters = parameters::check(&plugin.name, &plugin.parameters, &vm.spec.parameters)
        .map_err(Error::Parameters)?;
    Ok(VmSpec {
        name: vm.name_any(),
        namespace: vm.namespace().unwrap_or_default(),
        uid: vm.meta().uid.clone().ok_or(Error::Metadata("uid"))?,
        image: vm.spec.image.clone(),
        cpu: vm.spec.cpu,
        memory_mib: to_mib(&vm.spec.memory).map_err(Error::Memory)?,
        user_data: vm.spec.user_data.clone(),
        labels: vm.labels().clone(),
        parameters,
    })
}
