//! vmop provider plugin for AWS EC2, over the EC2 Query API (version 2016-11-15) with
//! Signature Version 4.
//!
//! ProviderConfig settings: `region` (required), `endpoint` (default
//! `https://ec2.<region>.amazonaws.com`), `instanceType` (overrides the size table in
//! [`instance_types`]), `subnetId`, `securityGroupIds`, `keyName`.
//! Credentials Secret: `access_key_id`, `secret_access_key`, optional `session_token`.
//! The endpoint must be in the ProviderConfig's `allowedHosts`.

mod errors;
mod instance;
pub mod instance_types;
mod launch;
mod query;
mod sigv4;
mod xml;

use vmop_provider_sdk::error::{invalid_spec, transient};
use vmop_provider_sdk::{
    Config, PluginInfo, Provider, ProviderError, VmSpec, VmStatus, WIT_VERSION, info, warn,
};

use crate::instance::Instance;
use crate::launch::TAG_UID;
use crate::query::{CallError, Ec2, Params};

/// States of an instance that still stands for its VM; a terminated one does not.
const LIVE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];
/// Client tokens tried per create (see [`Ec2Provider::create`]).
const MAX_TOKEN_GENERATIONS: usize = 3;

struct Ec2Provider;

impl Provider for Ec2Provider {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "ec2".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            wit_version: WIT_VERSION.to_owned(),
            capabilities: vec!["user-data".to_owned()],
        }
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
        let ec2 = Ec2::from_config(config)?;
        if let Some(existing) = find_by_uid(&ec2, &spec.uid)? {
            info!(
                "instance {} already exists for uid {}",
                existing.id, spec.uid
            );
            return Ok(existing.to_status());
        }
        check_image(&ec2, launch::image_id(&spec.image)?)?;
        let mut token = spec.uid.clone();
        for _ in 0..MAX_TOKEN_GENERATIONS {
            let params = launch::run_instances_params(config, &spec, &token)?;
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
        let ec2 = Ec2::from_config(config)?;
        let mut params = Params::new();
        params.push("InstanceId.1", id);
        let body = match ec2.call("DescribeInstances", &params) {
            Err(err) if is_missing_instance(&err) => return Ok(None),
            result => result?,
        };
        let instances = xml::instances(&body).map_err(CallError::xml("DescribeInstances"))?;
        Ok(instances
            .into_iter()
            .find(|i| i.id == id && !i.is_gone())
            .map(|i| i.to_status()))
    }

    fn delete(config: &Config, id: &str) -> Result<(), ProviderError> {
        let ec2 = Ec2::from_config(config)?;
        let mut params = Params::new();
        params.push("InstanceId.1", id);
        match ec2.call("TerminateInstances", &params) {
            Err(err) if is_missing_instance(&err) => Ok(()),
            Err(err) => Err(err.into()),
            Ok(_) => {
                info!("terminating instance {id}");
                Ok(())
            }
        }
    }
}

vmop_provider_sdk::export_provider!(Ec2Provider);

/// The live instance tagged with `uid`; the oldest if a race made several.
fn find_by_uid(ec2: &Ec2, uid: &str) -> Result<Option<Instance>, ProviderError> {
    let mut params = Params::new();
    params.filter(1, &format!("tag:{TAG_UID}"), &[uid]).filter(
        2,
        "instance-state-name",
        &LIVE_STATES,
    );
    let body = ec2.call("DescribeInstances", &params)?;
    let mut found = xml::instances(&body).map_err(CallError::xml("DescribeInstances"))?;
    found.retain(|i| !i.is_gone());
    found.sort_by(|a, b| (&a.launch_time, &a.id).cmp(&(&b.launch_time, &b.id)));
    if found.len() > 1 {
        let ids: Vec<&str> = found.iter().map(|i| i.id.as_str()).collect();
        warn!("several instances carry uid {uid}: {ids:?}; using the oldest");
    }
    Ok(found.into_iter().next())
}

/// `DescribeImages` for `image`: an image that does not exist (or is not visible to this
/// account) is the user's to fix, and EC2's own `RunInstances` may accept it and fail later.
fn check_image(ec2: &Ec2, image: &str) -> Result<(), ProviderError> {
    let mut params = Params::new();
    params.push("ImageId.1", image);
    let body = ec2.call("DescribeImages", &params)?;
    let ids = xml::image_ids(&body).map_err(CallError::xml("DescribeImages"))?;
    if ids.iter().any(|id| id == image) {
        Ok(())
    } else {
        Err(invalid_spec(format!(
            "image {image} does not exist or is not visible to this account"
        )))
    }
}

/// A missing or malformed id: there is no such instance, which is an answer, not a failure.
fn is_missing_instance(err: &CallError) -> bool {
    matches!(
        err.code(),
        Some("InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed")
    )
}
