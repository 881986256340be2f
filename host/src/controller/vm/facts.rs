//! What a VM's reconcile starts from: the watch predicate, the [`Facts`] [`decide`] needs, the
//! spec handed to the plugin and the VM's poll interval.
//!
//! Facts are built once per reconcile: [`unresolved`] from the object and what this process
//! knows, before the ProviderConfig is resolved (enough to decide a pause), then
//! [`Facts::resolved`] adds what the plugin and the ProviderConfig tell.
//!
//! [`decide`]: super::decide::decide

use std::collections::BTreeSet;
use std::time::Duration;

use kube::{Resource, ResourceExt};

use super::attempts::Attempts;
use super::decide::{Capabilities, Day2, Facts};
use crate::api::quantity::to_mib;
use crate::api::{
    AppliedSpec, CREATE_LOCATION, CREATE_PARAMETERS, PAUSED, POLL_INTERVAL, RECONCILE_REQUESTED_AT,
    VirtualMachine, conditions,
};
use crate::api::{duration, parameters};
use crate::controller::context::Options;
use crate::controller::error::Error;
use crate::plugin::{PluginInfo, VmSpec};

/// The watch predicate of VirtualMachines: a reconcile is triggered when this changes, that is
/// when the generation (spec, deletion) or one of the annotations a user sets to steer the
/// operator (`vmop.dev/paused`, `vmop.dev/reconcile-requested-at`, `vmop.dev/poll-interval`)
/// changes; not on the operator's own writes (status, finalizer, create location).
/// Test: `tests/tests/operator/operator_day2_pause.rs`.
pub fn trigger_key(vm: &VirtualMachine) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    vm.meta().generation.hash(&mut h);
    for key in [PAUSED, RECONCILE_REQUESTED_AT, POLL_INTERVAL] {
        vm.annotations().get(key).hash(&mut h);
    }
    Some(h.finish())
}

/// What [`decide`](super::decide::decide) needs: the object, what `attempts` knows with the
/// ProviderConfig's creation grace period, and the plugin with the spec it is handed (`None`
/// before the ProviderConfig is resolved: no capability, nothing desired).
pub fn facts(
    vm: &VirtualMachine,
    attempts: &Attempts,
    grace: Duration,
    plugin: Option<(&PluginInfo, &VmSpec)>,
) -> Facts {
    let facts = unresolved(vm, attempts);
    match plugin {
        Some((info, spec)) => facts.resolved(attempts, grace, info, spec),
        None => Facts {
            absence_wait: attempts.absence_wait(&facts.day2.uid, grace),
            ..facts
        },
    }
}

/// The facts of `vm` before its ProviderConfig is resolved: no capability, nothing desired and
/// no grace period. Enough to decide a pause, which needs no observation; anything else is
/// decided on [`Facts::resolved`].
pub(super) fn unresolved(vm: &VirtualMachine, attempts: &Attempts) -> Facts {
    let status = vm.status.as_ref();
    let spec = &vm.spec;
    let uid = vm.meta().uid.clone().unwrap_or_default();
    Facts {
        deleting: vm.meta().deletion_timestamp.is_some(),
        deletion_policy: spec.deletion_policy,
        id: status.and_then(|s| s.id.clone()),
        recorded_location: status.and_then(|s| s.location.clone()),
        // What this process itself attempted beats an annotation the informer may show from
        // before its own writes.
        intended_location: attempts
            .reached_location(&uid)
            .or_else(|| vm.annotations().get(CREATE_LOCATION).cloned()),
        accept_location: spec.accept_location.clone(),
        absence_wait: attempts.absence_wait(&uid, Duration::ZERO),
        never_created: attempts.never_created(&uid),
        sole_machine: attempts.sole_machine(&uid),
        day2: Day2 {
            paused: vm.annotations().get(PAUSED).is_some_and(|v| v == "true"),
            policy: spec.management_policy,
            power: spec.power_state,
            strategy: spec.update_strategy,
            external_id: spec.external_id.clone(),
            desired: AppliedSpec::default(),
            applied: status.and_then(|s| s.applied.clone()),
            // Unreadable (edited by hand) counts as not recorded: recorded again before a create.
            create_parameters: vm
                .annotations()
                .get(CREATE_PARAMETERS)
                .and_then(|v| serde_json::from_str(v).ok()),
            restart_required: status
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::RESTART_REQUIRED)),
            replacement_required: status
                .and_then(|s| conditions::find(&s.conditions, conditions::SYNCED))
                .is_some_and(|c| {
                    c.status == "False"
                        && c.reason == conditions::REPLACEMENT_REQUIRED
                        && c.observed_generation == vm.meta().generation
                }),
            capabilities: Capabilities::default(),
            launch_only: BTreeSet::new(),
            uid,
        },
    }
}

impl Facts {
    /// These facts completed with what the resolved ProviderConfig tells: its creation grace
    /// period, the plugin's capabilities and launch-only parameters, and the spec it is handed.
    pub fn resolved(
        mut self,
        attempts: &Attempts,
        grace: Duration,
        info: &PluginInfo,
        spec: &VmSpec,
    ) -> Facts {
        self.absence_wait = attempts.absence_wait(&self.day2.uid, grace);
        self.day2.desired = AppliedSpec {
            cpu: spec.cpu,
            memory_mib: spec.memory_mib,
            parameters: spec.parameters.clone(),
            pending: false,
        };
        self.day2.capabilities = Capabilities::of(info);
        self.day2.launch_only = info
            .parameters
            .iter()
            .filter(|p| !p.mutable)
            .map(|p| p.name.clone())
            .collect();
        self
    }
}

/// The spec handed to the plugin, its `spec.parameters` checked against what `plugin`
/// declares (an unknown or ill-typed one is [`Error::Parameters`], before any call).
/// The annotations are checked here too: an unparsable `vmop.dev/poll-interval` is
/// [`Error::Annotation`].
pub fn vm_spec(vm: &VirtualMachine, plugin: &PluginInfo) -> Result<VmSpec, Error> {
    requested_poll_interval(vm)?;
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

/// Annotation `vmop.dev/poll-interval`, if set.
fn requested_poll_interval(vm: &VirtualMachine) -> Result<Option<Duration>, Error> {
    vm.annotations()
        .get(POLL_INTERVAL)
        .map(|text| {
            duration::parse_positive(text).map_err(|source| Error::Annotation {
                key: POLL_INTERVAL,
                source,
            })
        })
        .transpose()
}

/// How often a settled `vm` is re-checked: annotation `vmop.dev/poll-interval`, never below
/// `options.min_poll_interval`; else (or if [`vm_spec`] would refuse it) the resync period.
pub(super) fn poll_interval(vm: &VirtualMachine, options: &Options) -> Duration {
    requested_poll_interval(vm)
        .ok()
        .flatten()
        .map_or(options.resync_period, |d| d.max(options.min_poll_interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(annotations: &[(&str, &str)]) -> VirtualMachine {
        let mut vm = VirtualMachine::new("web", Default::default());
        vm.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        vm
    }

    #[test]
    fn poll_interval_is_the_annotation_clamped_to_the_minimum() {
        let mut options = Options::new("ops");
        options.resync_period = Duration::from_secs(300);
        options.min_poll_interval = Duration::from_secs(10);
        assert_eq!(poll_interval(&vm(&[]), &options), Duration::from_secs(300));
        assert_eq!(
            poll_interval(&vm(&[(POLL_INTERVAL, "1m")]), &options),
            Duration::from_secs(60)
        );
        assert_eq!(
            poll_interval(&vm(&[(POLL_INTERVAL, "1s")]), &options),
            Duration::from_secs(10),
            "clamped"
        );
        assert_eq!(
            poll_interval(&vm(&[(POLL_INTERVAL, "500ms")]), &options),
            Duration::from_secs(10),
            "the flags' grammar, clamped"
        );
    }

    #[test]
    fn an_unparsable_poll_interval_is_refused_before_any_call() {
        for bad in ["soon", "10d", "0s", "18446744073709551615s"] {
            let error = requested_poll_interval(&vm(&[(POLL_INTERVAL, bad)]));
            assert!(
                matches!(&error, Err(e @ Error::Annotation { .. }) if e.reason() == "InvalidSpec"),
                "{bad}: {error:?}"
            );
        }
    }

    #[test]
    fn only_the_value_true_pauses() {
        let attempts = Attempts::new();
        assert!(unresolved(&vm(&[(PAUSED, "true")]), &attempts).day2.paused);
        assert!(!unresolved(&vm(&[(PAUSED, "false")]), &attempts).day2.paused);
        assert!(!unresolved(&vm(&[]), &attempts).day2.paused);
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::Value;

        use super::super::*;
        use crate::api::VirtualMachineSpec;
        use crate::plugin::{Parameter, ParameterKind};

        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                ".{0,80}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::btree_map("[a-z]{0,4}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn kind() -> impl Strategy<Value = ParameterKind> {
            prop_oneof![
                Just(ParameterKind::Text),
                Just(ParameterKind::Integer),
                Just(ParameterKind::Boolean),
                Just(ParameterKind::StringList),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

            /// Whatever a user writes in annotations, cpu, memory and parameters, and whatever
            /// parameters a plugin declares: the facts, the spec handed to the plugin and the
            /// poll interval are computed without a panic, and a refusal is a typed error.
            #[test]
            fn no_spec_or_annotation_panics_the_reconcile(
                annotations in proptest::collection::btree_map(
                    prop_oneof![
                        Just(PAUSED.to_owned()),
                        Just(POLL_INTERVAL.to_owned()),
                        Just(RECONCILE_REQUESTED_AT.to_owned()),
                        Just(CREATE_LOCATION.to_owned()),
                        Just(CREATE_PARAMETERS.to_owned()),
                        ".{0,20}",
                    ],
                    ".{0,40}",
                    0..5,
                ),
                cpu in any::<u32>(),
                memory in prop_oneof![".{0,12}", "[0-9]{1,25}(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?"],
                parameters in proptest::collection::btree_map("[a-zA-Z]{0,6}", json(), 0..4),
                declared in proptest::collection::vec(("[a-zA-Z]{0,6}", kind(), any::<bool>()), 0..4),
                grace in prop_oneof![Just(Duration::MAX), (0u64..1_000_000).prop_map(Duration::from_millis)],
            ) {
                let mut vm = VirtualMachine::new(
                    "web",
                    VirtualMachineSpec {
                        parameters,
                        ..VirtualMachineSpec::new("pc", "img", cpu, memory)
                    },
                );
                vm.metadata.uid = Some("uid-1".into());
                vm.metadata.namespace = Some("ns".into());
                vm.metadata.annotations = Some(annotations);
                let info = PluginInfo {
                    name: "p".into(),
                    version: "1".into(),
                    wit_version: "0.2.0".into(),
                    capabilities: vec!["update".into(), "power".into()],
                    parameters: declared
                        .into_iter()
                        .map(|(name, kind, mutable)| Parameter {
                            name,
                            kind,
                            description: String::new(),
                            mutable,
                        })
                        .collect(),
                };
                let attempts = Attempts::new();
                let unresolved = unresolved(&vm, &attempts);
                if let Ok(spec) = vm_spec(&vm, &info) {
                    let _ = unresolved.resolved(&attempts, grace, &info, &spec);
                }
                let _ = poll_interval(&vm, &Options::new("ops"));
            }
        }
    }
}
