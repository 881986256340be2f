//! The `RunInstances` parameters for a VM spec: image, size, idempotency token, tags.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use vmop_provider_sdk::error::invalid_spec;
use vmop_provider_sdk::{Config, ProviderError, VmSpec};

use crate::instance_types;
use crate::query::Params;

pub const TAG_NAMESPACE: &str = "vmop.dev/namespace";
pub const TAG_NAME: &str = "vmop.dev/name";
pub const TAG_UID: &str = "vmop.dev/uid";

/// EC2 allows 50 tags per resource; ours take four.
const MAX_LABEL_TAGS: usize = 46;

/// `spec.image` as an AMI id. Only ids are accepted: names and aliases resolve differently per
/// region and account, and a silent mismatch would boot the wrong machine.
pub fn image_id(image: &str) -> Result<&str, ProviderError> {
    let valid = image
        .strip_prefix("ami-")
        .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_alphanumeric()));
    if valid {
        Ok(image)
    } else {
        Err(invalid_spec(format!(
            "image `{image}` is not an EC2 AMI id (expected `ami-` followed by its id)"
        )))
    }
}

/// Setting `instanceType`, else the smallest type of the table that fits cpu and memory.
pub fn instance_type<'a>(config: &'a Config, spec: &VmSpec) -> Result<&'a str, ProviderError> {
    if let Some(explicit) = config.settings.get("instanceType") {
        return Ok(explicit);
    }
    instance_types::for_size(spec.cpu, spec.memory_mib).ok_or_else(|| {
        invalid_spec(format!(
            "no instance type in the provider's table has {} vCPUs and {} MiB; set \
             `instanceType` in the ProviderConfig",
            spec.cpu, spec.memory_mib
        ))
    })
}

/// The parameters of `RunInstances` for `spec`. With `client_token` derived from the VM's uid,
/// real EC2 answers a repeated launch with the first instance; the tags make it findable by uid
/// everywhere.
///
/// Optional settings: `subnetId`, `securityGroupIds` (comma-separated), `keyName`.
pub fn run_instances_params(
    config: &Config,
    spec: &VmSpec,
    client_token: &str,
) -> Result<Params, ProviderError> {
    let mut params = Params::new();
    params
        .push("ImageId", image_id(&spec.image)?)
        .push("InstanceType", instance_type(config, spec)?)
        .push("MinCount", "1")
        .push("MaxCount", "1")
        .push("ClientToken", checked_token(client_token)?);
    if let Some(user_data) = &spec.user_data {
        params.push("UserData", STANDARD.encode(user_data));
    }
    if let Some(subnet) = config.settings.get("subnetId") {
        params.push("SubnetId", subnet);
    }
    if let Some(groups) = config.settings.get("securityGroupIds") {
        let groups = groups.split(',').map(str::trim).filter(|g| !g.is_empty());
        for (i, group) in groups.enumerate() {
            params.push(format!("SecurityGroupId.{}", i + 1), group);
        }
    }
    if let Some(key) = config.settings.get("keyName") {
        params.push("KeyName", key);
    }

    params.push("TagSpecification.1.ResourceType", "instance");
    let own = [
        ("Name", spec.name.as_str()),
        (TAG_NAMESPACE, spec.namespace.as_str()),
        (TAG_NAME, spec.name.as_str()),
        (TAG_UID, spec.uid.as_str()),
    ];
    let labels = spec
        .labels
        .iter()
        .filter(|(k, v)| is_taggable(k, v) && !own.iter().any(|(o, _)| o == k))
        .take(MAX_LABEL_TAGS)
        .map(|(k, v)| (k.as_str(), v.as_str()));
    for (i, (key, value)) in own.into_iter().chain(labels).enumerate() {
        params.push(format!("TagSpecification.1.Tag.{}.Key", i + 1), key);
        params.push(format!("TagSpecification.1.Tag.{}.Value", i + 1), value);
    }
    Ok(params)
}

/// EC2 takes up to 64 ASCII characters; a Kubernetes UID is a 36-character UUID, and with an
/// instance id appended 56.
fn checked_token(token: &str) -> Result<&str, ProviderError> {
    if token.is_empty() || token.len() > 64 || !token.is_ascii() {
        return Err(invalid_spec(format!(
            "`{token}` cannot be an EC2 client token"
        )));
    }
    Ok(token)
}

/// Labels EC2 accepts as tags: key ≤ 128 and value ≤ 256 characters, no reserved `aws:` prefix.
fn is_taggable(key: &str, value: &str) -> bool {
    !key.is_empty()
        && key.chars().count() <= 128
        && value.chars().count() <= 256
        && !key.to_ascii_lowercase().starts_with("aws:")
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-0000-4000-8000-000000000001";

    fn spec() -> VmSpec {
        VmSpec {
            name: "web".into(),
            namespace: "team-a".into(),
            uid: UID.into(),
            image: "ami-12c6146b".into(),
            cpu: 2,
            memory_mib: 4096,
            user_data: Some("#!/bin/sh\necho hi\n".into()),
            labels: vec![
                ("app".into(), "web".into()),
                ("aws:reserved".into(), "x".into()),
            ],
        }
    }

    fn get<'a>(params: &'a Params, name: &str) -> Option<&'a str> {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn builds_run_instances() {
        let params = run_instances_params(&Config::default(), &spec(), UID).unwrap();
        assert_eq!(get(&params, "ImageId"), Some("ami-12c6146b"));
        assert_eq!(get(&params, "InstanceType"), Some("t3.medium"));
        assert_eq!(
            get(&params, "ClientToken"),
            Some("0f1e2d3c-0000-4000-8000-000000000001")
        );
        assert_eq!(get(&params, "UserData"), Some("IyEvYmluL3NoCmVjaG8gaGkK"));
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.2.Key"),
            Some(TAG_NAMESPACE)
        );
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.2.Value"),
            Some("team-a")
        );
        assert_eq!(get(&params, "TagSpecification.1.Tag.4.Key"), Some(TAG_UID));
        assert_eq!(get(&params, "TagSpecification.1.Tag.5.Key"), Some("app"));
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.6.Key"),
            None,
            "aws: labels are skipped"
        );
    }

    #[test]
    fn settings_override_and_extend() {
        let config = Config {
            settings: [
                ("instanceType", "c5.large"),
                ("subnetId", "subnet-1"),
                ("securityGroupIds", "sg-1, sg-2"),
            ]
            .into_iter()
            .collect(),
            ..Config::default()
        };
        let params = run_instances_params(&config, &spec(), UID).unwrap();
        assert_eq!(get(&params, "InstanceType"), Some("c5.large"));
        assert_eq!(get(&params, "SubnetId"), Some("subnet-1"));
        assert_eq!(get(&params, "SecurityGroupId.2"), Some("sg-2"));
    }

    #[test]
    fn rejects_what_ec2_cannot_launch() {
        assert!(matches!(
            image_id("ubuntu-22.04"),
            Err(ProviderError::InvalidSpec(_))
        ));
        assert!(matches!(
            image_id("ami-"),
            Err(ProviderError::InvalidSpec(_))
        ));
        let mut huge = spec();
        huge.cpu = 1000;
        let err = run_instances_params(&Config::default(), &huge, UID).err();
        assert!(matches!(err, Some(ProviderError::InvalidSpec(m)) if m.contains("instanceType")));
        let long = format!("{UID}/i-0123456789abcdef0123456789");
        let err = run_instances_params(&Config::default(), &spec(), &long).err();
        assert!(matches!(err, Some(ProviderError::InvalidSpec(_))));
    }
}
