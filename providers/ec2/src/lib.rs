//! vmop provider plugin for AWS EC2, over the EC2 Query API (version 2016-11-15) with
//! Signature Version 4.
//!
//! ProviderConfig settings: `region` (required), `endpoint` (default
//! `https://ec2.<region>.amazonaws.com`), `stsEndpoint` (for `location`; default `endpoint`
//! when that is set, since EC2 stand-ins such as moto serve STS on the same port, else
//! `https://sts.<region>.amazonaws.com`), and the launch settings of `parameters.rs`
//! (`instanceType`, `subnetId`, `securityGroupIds`, `keyName`, `rootVolumeSizeGiB`, `tags`),
//! which a VM's `spec.parameters` override, and `listPageSize` (instances per `list` page,
//! 5..=1000, default 1000; see `list.rs`). Credentials Secret: `access_key_id`,
//! `secret_access_key`, optional `session_token`. Both endpoints must be in the
//! ProviderConfig's `allowedHosts`.
//!
//! # Eventual consistency
//!
//! EC2's reads lag its writes: right after `RunInstances`, `DescribeInstances` and
//! `TerminateInstances` may answer `InvalidInstanceID.NotFound` for the new instance. `get`
//! answers that as `None` and `delete` as success, as for any id EC2 does not know. The plugin
//! does not try to hide the lag (it has no memory between calls to tell "new" from "gone"):
//! the host allows for it with its creation grace period, during which a `None` is not taken
//! as "gone", and with `find`, which looks the machine up by the VM's uid tag when no id is
//! recorded. A `delete` that raced the lag is repeated by the host until `get` confirms the
//! instance is gone.

mod errors;
mod instance;
pub mod instance_types;
mod launch;
mod list;
mod location;
mod lookup;
mod parameters;
mod power;
mod query;
mod update;
mod xml;

use vmop_provider_sdk::error::transient;
use vmop_provider_sdk::{
    Config, Page, PluginInfo, Provider, ProviderError, UpdateOutcome, VmSpec, VmStatus,
    WIT_VERSION, info, warn,
};

use crate::power::Power;
use crate::query::{Api, CallError, Params};

/// Client tokens tried per create (see [`Ec2Provider::create`]): one more than the times the
/// VM's instance was terminated behind its back within EC2's memory of client tokens (at least
/// 24 hours). A repeated token is answered from that memory, without a launch, so each costs
/// one cheap call; past this many the create fails (transient) saying so.
const MAX_TOKEN_GENERATIONS: usize = 32;

/// `user-data` (`spec.userData` is passed to `RunInstances`), `update` (the instance type, see
/// `update.rs`), `power` and `list` (the cluster's instances by tag, see `list.rs`).
const CAPABILITIES: [&str; 4] = ["user-data", "update", "power", "list"];

struct Ec2Provider;

impl Provider for Ec2Provider {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "ec2".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            wit_version: WIT_VERSION.to_owned(),
            capabilities: CAPABILITIES.map(str::to_owned).to_vec(),
            parameters: parameters::declared(),
        }
    }

    fn location(config: &Config) -> Result<String, ProviderError> {
        location::location(config)
    }

    /// The instance `create` made for `uid`, by its `vmop.dev/uid` tag (searchable at once,
    /// unlike a fresh instance id).
    fn find(config: &Config, uid: &str) -> Result<Option<VmStatus>, ProviderError> {
        let ec2 = Api::ec2(config)?;
        Ok(lookup::by_uid(&ec2, uid)?.map(|i| i.to_status()))
    }

    /// Idempotent on the uid twice over: an existing live instance tagged with it is returned
    /// (this is what makes a retry safe against clouds that ignore `ClientToken`, such as moto),
    /// and `RunInstances` carries a client token derived from the uid (what makes two racing
    /// creates safe on real EC2).
    ///
    /// EC2 remembers a client token after its instance is terminated and answers a repeated
    /// launch with that dead instance. Recreating a VM whose instance was deleted behind its
    /// back therefore relaunches with the token `<uid>/<dead instance id>`: racing creates
    /// observe the same dead instance and so still share one token.
    fn create(config: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError> {
        let ec2 = Api::ec2(config)?;
        if let Some(existing) = lookup::by_uid(&ec2, &spec.uid)? {
            info!(
                "instance {} already exists for uid {}",
                existing.id, spec.uid
            );
            return Ok(existing.to_status());
        }
        let image = lookup::image(&ec2, launch::image_id(&spec.image)?)?;
        let mut token = spec.uid.clone();
        for _ in 0..MAX_TOKEN_GENERATIONS {
            let params = launch::run_instances_params(config, &spec, &image, &token)?;
            let body = ec2.call("RunInstances", &params)?;
            let launched = xml::instances(&body).map_err(CallError::xml("RunInstances"))?;
            let instance = launched
                .into_iter()
                .next()
                .ok_or_else(|| transient("RunInstances answered without an instance"))?;
            if !instance.is_gone() {
                info!(
                    "launched instance {} for {}/{}",
                    instance.id, spec.namespace, spec.name
                );
                return Ok(instance.to_status());
            }
            warn!(
                "client token {token} belongs to terminated instance {}",
                instance.id
            );
            token = format!("{}/{}", spec.uid, instance.id);
        }
        Err(transient(format!(
            "RunInstances kept answering with terminated instances for uid {}",
            spec.uid
        )))
    }

    fn get(config: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError> {
        let ec2 = Api::ec2(config)?;
        Ok(lookup::by_id(&ec2, id)?.map(|i| i.to_status()))
    }

    fn update(config: &Config, id: &str, spec: VmSpec) -> Result<UpdateOutcome, ProviderError> {
        let ec2 = Api::ec2(config)?;
        let desired_type = launch::instance_type(config, &spec)?;
        update::apply(&ec2, id, &spec, &config.cluster, &desired_type)
    }

    fn start(config: &Config, id: &str) -> Result<(), ProviderError> {
        power::set(&Api::ec2(config)?, id, Power::On)
    }

    fn stop(config: &Config, id: &str) -> Result<(), ProviderError> {
        power::set(&Api::ec2(config)?, id, Power::Off)
    }

    fn list(config: &Config, cursor: Option<String>) -> Result<Page, ProviderError> {
        list::list(config, cursor.as_deref())
    }

    fn delete(config: &Config, id: &str) -> Result<(), ProviderError> {
        let ec2 = Api::ec2(config)?;
        let mut params = Params::new();
        params.push("InstanceId.1", id);
        match ec2.call("TerminateInstances", &params) {
            Err(err) if lookup::is_missing_instance(&err) => Ok(()),
            Err(err) => Err(err.into()),
            Ok(_) => {
                info!("terminating instance {id}");
                Ok(())
            }
        }
    }
}

vmop_provider_sdk::export_provider!(Ec2Provider);
