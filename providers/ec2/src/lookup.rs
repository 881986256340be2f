//! Read-only EC2 lookups shared by the operations: an instance by id, by uid tag, an image.

use vmop_provider_sdk::ProviderError;
use vmop_provider_sdk::error::invalid_spec;
use vmop_provider_sdk::tags::TAG_UID;
use vmop_provider_sdk::warn;

use crate::instance::Instance;
use crate::query::{Api, CallError, Params};
use crate::xml::{self, Image};

/// States of an instance that still stands for its VM; a terminated one does not.
pub const LIVE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// The live instance tagged with `uid`; the oldest if a race made several.
pub fn by_uid(ec2: &Api, uid: &str) -> Result<Option<Instance>, ProviderError> {
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

/// The live instance `id`; `None` when EC2 does not know it (see the crate docs on eventual
/// consistency) or it is terminated or shutting down.
pub fn by_id(ec2: &Api, id: &str) -> Result<Option<Instance>, ProviderError> {
    let mut params = Params::new();
    params.push("InstanceId.1", id);
    let body = match ec2.call("DescribeInstances", &params) {
        Err(err) if is_missing_instance(&err) => return Ok(None),
        result => result?,
    };
    let instances = xml::instances(&body).map_err(CallError::xml("DescribeInstances"))?;
    Ok(instances.into_iter().find(|i| i.id == id && !i.is_gone()))
}

/// `DescribeImages` for `image`: an image that does not exist (or is not visible to this
/// account) is the user's to fix, and EC2's own `RunInstances` may accept it and fail later.
pub fn image(ec2: &Api, image: &str) -> Result<Image, ProviderError> {
    let mut params = Params::new();
    params.push("ImageId.1", image);
    let body = ec2.call("DescribeImages", &params)?;
    let images = xml::images(&body).map_err(CallError::xml("DescribeImages"))?;
    images.into_iter().find(|i| i.id == image).ok_or_else(|| {
        invalid_spec(format!(
            "image {image} does not exist or is not visible to this account"
        ))
    })
}

/// A missing or malformed id: there is no such instance, which is an answer, not a failure.
pub fn is_missing_instance(err: &CallError) -> bool {
    matches!(
        err.code(),
        Some("InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed")
    )
}
