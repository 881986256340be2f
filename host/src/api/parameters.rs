//! `VirtualMachine.spec.parameters` checked against what the plugin declares
//! (`plugin-info.parameters`), and turned into the text `vm-spec.parameters` carries.
//!
//! # Guarantees
//!
//! - Only declared names pass; each value must be of its declared kind. The first offending
//!   parameter (in name order) is named in the error, so the user sees which one to fix.
//! - Values are converted without loss of meaning: integers and booleans from JSON or from
//!   their text, string lists from a JSON list of strings or a comma-separated string.
//!
//! Tests: `tests` here; `tests/tests/operator/operator_day2.rs` (`per_vm_parameters_reach_moto_and_bad_ones_are_refused_before_any_call`)
//! proves the host refuses before any cloud call.

use std::collections::BTreeMap;

use serde_json::Value;

use vmop_runtime::{Parameter, ParameterKind};

/// Why `spec.parameters` cannot be handed to the plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParameterError {
    #[error(
        "spec.parameters.{name} is not a parameter of plugin {plugin} (it accepts: {accepted})"
    )]
    Unknown {
        name: String,
        plugin: String,
        accepted: String,
    },
    #[error("spec.parameters.{name} must be {expected}, got {got}")]
    Kind {
        name: String,
        expected: &'static str,
        got: String,
    },
}

/// The parameters as `vm-spec.parameters` carries them, or the first one that is not allowed.
pub fn check(
    plugin: &str,
    declared: &[Parameter],
    given: &BTreeMap<String, Value>,
) -> Result<BTreeMap<String, String>, ParameterError> {
    let mut out = BTreeMap::new();
    for (name, value) in given {
        let Some(parameter) = declared.iter().find(|p| &p.name == name) else {
            let accepted: Vec<&str> = declared.iter().map(|p| p.name.as_str()).collect();
            return Err(ParameterError::Unknown {
                name: name.clone(),
                plugin: plugin.to_owned(),
                accepted: if accepted.is_empty() {
                    "none".to_owned()
                } else {
                    accepted.join(", ")
                },
            });
        };
        let text = convert(parameter.kind, value).ok_or_else(|| ParameterError::Kind {
            name: name.clone(),
            expected: expected(parameter.kind),
            got: describe(value),
        })?;
        out.insert(name.clone(), text);
    }
    Ok(out)
}

fn convert(kind: ParameterKind, value: &Value) -> Option<String> {
    match (kind, value) {
        (ParameterKind::Text, Value::String(s)) => Some(s.clone()),
        (ParameterKind::Text, Value::Number(n)) => Some(n.to_string()),
        (ParameterKind::Integer, Value::Number(n)) => n.as_i64().map(|i| i.to_string()),
        (ParameterKind::Integer, Value::String(s)) => {
            s.trim().parse::<i64>().ok().map(|i| i.to_string())
        }
        (ParameterKind::Boolean, Value::Bool(b)) => Some(b.to_string()),
        (ParameterKind::Boolean, Value::String(s)) if s == "true" || s == "false" => {
            Some(s.clone())
        }
        (ParameterKind::StringList, Value::String(s)) => Some(s.clone()),
        (ParameterKind::StringList, Value::Array(items)) => {
            let items: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            let items = items?;
            // A comma inside an item would split it in two on the plugin's side.
            if items.iter().any(|i| i.contains(',')) {
                return None;
            }
            Some(items.join(","))
        }
        _ => None,
    }
}

fn expected(kind: ParameterKind) -> &'static str {
    match kind {
        ParameterKind::Text => "a string",
        ParameterKind::Integer => "an integer",
        ParameterKind::Boolean => "true or false",
        ParameterKind::StringList => {
            "a list of strings (without commas) or a comma-separated string"
        }
    }
}

fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let text = vmop_contract::text::truncate(value.to_string(), 64);
    format!("{kind} ({text})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn declared() -> Vec<Parameter> {
        [
            ("subnetId", ParameterKind::Text),
            ("rootVolumeSizeGiB", ParameterKind::Integer),
            ("ebsOptimized", ParameterKind::Boolean),
            ("securityGroupIds", ParameterKind::StringList),
        ]
        .into_iter()
        .map(|(name, kind)| Parameter {
            name: name.into(),
            kind,
            description: String::new(),
            mutable: false,
        })
        .collect()
    }

    fn given(v: Value) -> BTreeMap<String, Value> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn declared_parameters_of_their_kind_become_text() {
        let out = check(
            "ec2",
            &declared(),
            &given(json!({
                "subnetId": "subnet-1",
                "rootVolumeSizeGiB": 20,
                "ebsOptimized": true,
                "securityGroupIds": ["sg-1", "sg-2"],
            })),
        )
        .unwrap();
        assert_eq!(out["subnetId"], "subnet-1");
        assert_eq!(out["rootVolumeSizeGiB"], "20");
        assert_eq!(out["ebsOptimized"], "true");
        assert_eq!(out["securityGroupIds"], "sg-1,sg-2");
        let text = check(
            "ec2",
            &declared(),
            &given(json!({"rootVolumeSizeGiB": "30", "securityGroupIds": "sg-1,sg-3"})),
        )
        .unwrap();
        assert_eq!(text["rootVolumeSizeGiB"], "30");
        assert_eq!(text["securityGroupIds"], "sg-1,sg-3");
    }

    #[test]
    fn unknown_names_are_refused_by_name() {
        let err = check("ec2", &declared(), &given(json!({"subnet": "x"}))).unwrap_err();
        assert!(matches!(&err, ParameterError::Unknown { name, .. } if name == "subnet"));
        assert!(err.to_string().contains("spec.parameters.subnet"), "{err}");
        assert!(
            err.to_string().contains("subnetId"),
            "lists what is accepted: {err}"
        );
    }

    #[test]
    fn values_of_another_kind_are_refused_by_name() {
        for bad in [
            json!({"rootVolumeSizeGiB": "big"}),
            json!({"rootVolumeSizeGiB": 1.5}),
            json!({"ebsOptimized": "yes"}),
            json!({"securityGroupIds": [1, 2]}),
            json!({"securityGroupIds": ["a,b"]}),
            json!({"subnetId": {"id": "x"}}),
        ] {
            let err = check("ec2", &declared(), &given(bad.clone())).unwrap_err();
            assert!(matches!(err, ParameterError::Kind { .. }), "{bad}: {err}");
        }
    }
}
