//! The `spec.parameters` this provider accepts (`plugin-info.parameters`). Each overrides the
//! ProviderConfig setting of the same name for one VM; `launch.rs` reads them.

use vmop_provider_sdk::{Parameter, ParameterKind};

/// `(name, kind, description)`; the host refuses any other name, or a value of another kind.
const DECLARED: [(&str, ParameterKind, &str); 6] = [
    (
        "instanceType",
        ParameterKind::Text,
        "EC2 instance type, e.g. c5.large; default: the smallest t3/m5 type with the VM's cpu \
         and memory",
    ),
    (
        "subnetId",
        ParameterKind::Text,
        "subnet to launch into; default: the account's default subnet",
    ),
    (
        "securityGroupIds",
        ParameterKind::StringList,
        "security group ids for the instance's network interface",
    ),
    (
        "keyName",
        ParameterKind::Text,
        "name of the EC2 key pair installed on the instance",
    ),
    (
        "rootVolumeSizeGiB",
        ParameterKind::Integer,
        "size of the root EBS volume in GiB; default: the image's",
    ),
    (
        "tags",
        ParameterKind::StringList,
        "extra instance tags as key=value (aws:* keys and vmop's own tags are reserved)",
    ),
];

pub fn declared() -> Vec<Parameter> {
    DECLARED
        .iter()
        .map(|(name, kind, description)| Parameter {
            name: (*name).to_owned(),
            kind: *kind,
            description: (*description).to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_within_the_contract() {
        let declared = declared();
        let mut names: Vec<&str> = declared.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), declared.len());
        assert!(declared.len() <= vmop_provider_sdk::bounds::MAX_PARAMETERS);
    }
}
