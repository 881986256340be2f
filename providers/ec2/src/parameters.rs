//! The `spec.parameters` this provider accepts (`plugin-info.parameters`). Each overrides the
//! ProviderConfig setting of the same name for one VM; `launch.rs` reads them.

use vmop_provider_sdk::{Parameter, ParameterKind};

/// `(name, kind, mutable, description)`; the host refuses any other name, or a value of
/// another kind. Only `instanceType` reaches an existing instance (`update.rs`); the others are
/// launch-only (`mutable: false`): the host refuses a change of them after creation.
const DECLARED: [(&str, ParameterKind, bool, &str); 6] = [
    (
        "instanceType",
        ParameterKind::Text,
        true,
        "EC2 instance type, e.g. c5.large; default: the smallest t3/m5 type with the VM's cpu \
         and memory",
    ),
    (
        "subnetId",
        ParameterKind::Text,
        false,
        "subnet to launch into; default: the account's default subnet",
    ),
    (
        "securityGroupIds",
        ParameterKind::StringList,
        false,
        "security group ids for the instance's network interface",
    ),
    (
        "keyName",
        ParameterKind::Text,
        false,
        "name of the EC2 key pair installed on the instance",
    ),
    (
        "rootVolumeSizeGiB",
        ParameterKind::Integer,
        false,
        "size of the root EBS volume in GiB; default: the image's",
    ),
    (
        "tags",
        ParameterKind::StringList,
        false,
        "extra instance tags as key=value (aws:* keys and vmop's own tags are reserved)",
    ),
];

pub fn declared() -> Vec<Parameter> {
    DECLARED
        .iter()
        .map(|(name, kind, mutable, description)| Parameter {
            name: (*name).to_owned(),
            kind: *kind,
            description: (*description).to_owned(),
            mutable: *mutable,
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
        let mutable: Vec<&str> = declared
            .iter()
            .filter(|p| p.mutable)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(
            mutable,
            ["instanceType"],
            "only the type reaches a live instance"
        );
    }
}
