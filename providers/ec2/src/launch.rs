//! The `RunInstances` parameters for a VM spec: image, size, idempotency token, network,
//! root volume, user data and tags.
//!
//! Every setting read here can be given per VM in `spec.parameters` (declared in
//! `parameters.rs`), which overrides the ProviderConfig's setting of the same name.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use vmop_provider_sdk::config::Settings;
use vmop_provider_sdk::error::invalid_spec;
use vmop_provider_sdk::tags::Rules;
use vmop_provider_sdk::{Config, ProviderError, VmSpec};

use crate::instance_types;
use crate::query::Params;
use crate::xml::Image;

/// What EC2 takes as instance tags: 50 per resource, keys of ≤128 and values of ≤256
/// characters, none under the reserved `aws:` prefix; `Name` is what the console shows.
const TAGS: Rules = Rules {
    name_key: Some("Name"),
    max_tags: 50,
    max_key_chars: 128,
    max_value_chars: 256,
    reserved_prefix: Some("aws:"),
};

/// The largest EBS volume (io2 Block Express, 64 TiB); smaller limits of other volume types
/// are EC2's to report.
const MAX_ROOT_VOLUME_GIB: i64 = 65_536;

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

/// Setting or parameter `instanceType`, else the smallest type of the table that fits cpu and
/// memory.
pub fn instance_type(config: &Config, spec: &VmSpec) -> Result<String, ProviderError> {
    let settings = config.settings.with_overrides(&spec.parameters);
    type_in(&settings, spec).map(str::to_owned)
}

fn type_in<'a>(settings: &'a Settings, spec: &VmSpec) -> Result<&'a str, ProviderError> {
    if let Some(explicit) = settings.get("instanceType") {
        return Ok(explicit);
    }
    instance_types::for_size(spec.cpu, spec.memory_mib).ok_or_else(|| {
        invalid_spec(format!(
            "no instance type in the provider's table has {} vCPUs and {} MiB; set \
             `instanceType` in the ProviderConfig or the VM's parameters",
            spec.cpu, spec.memory_mib
        ))
    })
}

/// The parameters of `RunInstances` for `spec` from `image` (as `DescribeImages` reported it).
/// With `client_token` derived from the VM's uid, real EC2 answers a repeated launch with the
/// first instance; the tags make it findable by uid everywhere.
///
/// Optional settings and parameters: `subnetId`, `securityGroupIds` (comma-separated),
/// `keyName`, `rootVolumeSizeGiB`, `tags` (comma-separated `key=value`).
pub fn run_instances_params(
    config: &Config,
    spec: &VmSpec,
    image: &Image,
    client_token: &str,
) -> Result<Params, ProviderError> {
    let settings = config.settings.with_overrides(&spec.parameters);
    let mut params = Params::new();
    params
        .push("ImageId", image_id(&image.id)?)
        .push("InstanceType", type_in(&settings, spec)?)
        .push("MinCount", "1")
        .push("MaxCount", "1")
        .push("ClientToken", checked_token(client_token)?);
    if let Some(user_data) = &spec.user_data {
        params.push("UserData", STANDARD.encode(user_data));
    }
    if let Some(subnet) = settings.get("subnetId") {
        params.push("SubnetId", subnet);
    }
    if let Some(groups) = settings.get("securityGroupIds") {
        let groups = groups.split(',').map(str::trim).filter(|g| !g.is_empty());
        for (i, group) in groups.enumerate() {
            params.push(format!("SecurityGroupId.{}", i + 1), group);
        }
    }
    if let Some(key) = settings.get("keyName") {
        params.push("KeyName", key);
    }
    if let Some(size) = settings.get("rootVolumeSizeGiB") {
        let device = image.root_device_name.as_deref().ok_or_else(|| {
            invalid_spec(format!(
                "image {} reports no root device, so `rootVolumeSizeGiB` cannot be applied",
                image.id
            ))
        })?;
        params.push("BlockDeviceMapping.1.DeviceName", device).push(
            "BlockDeviceMapping.1.Ebs.VolumeSize",
            root_volume_gib(size)?,
        );
    }

    params.push("TagSpecification.1.ResourceType", "instance");
    for (i, (key, value)) in TAGS
        .for_spec(spec, &config.cluster, settings.get("tags"))?
        .into_iter()
        .enumerate()
    {
        params.push(format!("TagSpecification.1.Tag.{}.Key", i + 1), key);
        params.push(format!("TagSpecification.1.Tag.{}.Value", i + 1), value);
    }
    Ok(params)
}

/// A size in GiB EC2 can make a volume of.
fn root_volume_gib(value: &str) -> Result<String, ProviderError> {
    match value.trim().parse::<i64>() {
        Ok(gib) if (1..=MAX_ROOT_VOLUME_GIB).contains(&gib) => Ok(gib.to_string()),
        _ => Err(invalid_spec(format!(
            "rootVolumeSizeGiB `{value}` is not a size of 1..={MAX_ROOT_VOLUME_GIB} GiB"
        ))),
    }
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
            parameters: Vec::new(),
        }
    }

    fn image() -> Image {
        Image {
            id: "ami-12c6146b".into(),
            root_device_name: Some("/dev/xvda".into()),
        }
    }

    fn with_settings(settings: &[(&str, &str)]) -> Config {
        Config {
            settings: settings.iter().copied().collect(),
            ..Config::default()
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
        let params = run_instances_params(&Config::default(), &spec(), &image(), UID).unwrap();
        assert_eq!(get(&params, "ImageId"), Some("ami-12c6146b"));
        assert_eq!(get(&params, "InstanceType"), Some("t3.medium"));
        assert_eq!(
            get(&params, "ClientToken"),
            Some("0f1e2d3c-0000-4000-8000-000000000001")
        );
        assert_eq!(get(&params, "UserData"), Some("IyEvYmluL3NoCmVjaG8gaGkK"));
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.2.Key"),
            Some(vmop_provider_sdk::tags::TAG_NAMESPACE)
        );
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.2.Value"),
            Some("team-a")
        );
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.4.Key"),
            Some(vmop_provider_sdk::tags::TAG_UID)
        );
        assert_eq!(get(&params, "TagSpecification.1.Tag.5.Key"), Some("app"));
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.6.Key"),
            None,
            "aws: labels are skipped"
        );
    }

    #[test]
    fn the_cluster_is_tagged_after_the_uid() {
        let config = Config {
            cluster: "c-1".into(),
            ..Config::default()
        };
        let params = run_instances_params(&config, &spec(), &image(), UID).unwrap();
        assert_eq!(
            get(&params, "TagSpecification.1.Tag.5.Key"),
            Some(vmop_provider_sdk::tags::TAG_CLUSTER)
        );
        assert_eq!(get(&params, "TagSpecification.1.Tag.5.Value"), Some("c-1"));
        assert_eq!(get(&params, "TagSpecification.1.Tag.6.Key"), Some("app"));
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
        let params = run_instances_params(&config, &spec(), &image(), UID).unwrap();
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
        let err = run_instances_params(&Config::default(), &huge, &image(), UID).err();
        assert!(matches!(err, Some(ProviderError::InvalidSpec(m)) if m.contains("instanceType")));
        let long = format!("{UID}/i-0123456789abcdef0123456789");
        let err = run_instances_params(&Config::default(), &spec(), &image(), &long).err();
        assert!(matches!(err, Some(ProviderError::InvalidSpec(_))));
    }

    #[test]
    fn parameters_override_settings_per_vm() {
        let config = with_settings(&[
            ("subnetId", "subnet-default"),
            ("keyName", "ops"),
            ("instanceType", "t3.small"),
        ]);
        let mut spec = spec();
        spec.parameters = [
            ("subnetId", "subnet-vm"),
            ("securityGroupIds", "sg-9"),
            ("instanceType", "c5.xlarge"),
            ("rootVolumeSizeGiB", "40"),
            ("tags", "cost=42"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let params = run_instances_params(&config, &spec, &image(), UID).unwrap();
        assert_eq!(get(&params, "SubnetId"), Some("subnet-vm"));
        assert_eq!(get(&params, "KeyName"), Some("ops"), "settings still apply");
        assert_eq!(get(&params, "SecurityGroupId.1"), Some("sg-9"));
        assert_eq!(get(&params, "InstanceType"), Some("c5.xlarge"));
        assert_eq!(
            instance_type(&config, &spec).ok().as_deref(),
            Some("c5.xlarge")
        );
        assert_eq!(
            get(&params, "BlockDeviceMapping.1.DeviceName"),
            Some("/dev/xvda")
        );
        assert_eq!(
            get(&params, "BlockDeviceMapping.1.Ebs.VolumeSize"),
            Some("40")
        );
        assert_eq!(get(&params, "TagSpecification.1.Tag.5.Key"), Some("cost"));
        assert_eq!(get(&params, "TagSpecification.1.Tag.6.Key"), Some("app"));
    }

    #[test]
    fn root_volume_needs_a_size_and_a_root_device() {
        let config = with_settings(&[("rootVolumeSizeGiB", "0")]);
        let err = run_instances_params(&config, &spec(), &image(), UID).err();
        assert!(
            matches!(err, Some(ProviderError::InvalidSpec(m)) if m.contains("rootVolumeSizeGiB"))
        );
        let config = with_settings(&[("rootVolumeSizeGiB", "8")]);
        let bare = Image {
            root_device_name: None,
            ..image()
        };
        let err = run_instances_params(&config, &spec(), &bare, UID).err();
        assert!(matches!(err, Some(ProviderError::InvalidSpec(m)) if m.contains("root device")));
        let params = run_instances_params(&Config::default(), &spec(), &bare, UID).unwrap();
        assert_eq!(get(&params, "BlockDeviceMapping.1.DeviceName"), None);
    }
}
