//! `start` and `stop`. EC2 answers both idempotently: starting a running instance or stopping
//! a stopped one succeeds and reports the current state. During a transition (stopping,
//! pending) EC2 answers `IncorrectInstanceState`, which `errors.rs` maps to `transient`.

use vmop_provider_sdk::{ProviderError, info};

use crate::query::{Api, Params};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    On,
    Off,
}

impl Power {
    fn action(self) -> &'static str {
        match self {
            Power::On => "StartInstances",
            Power::Off => "StopInstances",
        }
    }
}

pub fn set(ec2: &Api, id: &str, power: Power) -> Result<(), ProviderError> {
    let mut params = Params::new();
    params.push("InstanceId.1", id);
    ec2.call(power.action(), &params)?;
    info!("{} {id}", power.action());
    Ok(())
}
