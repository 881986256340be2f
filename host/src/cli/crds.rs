//! `vmop crds`: prints the CustomResourceDefinitions as one multi-document YAML stream.
//!
//! The same YAML is committed under `crds/` (one file per CRD) and `host/tests/crds.rs` fails
//! when it drifts from the types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::{ProviderConfig, VirtualMachine};

#[derive(Debug, thiserror::Error)]
pub enum CrdsError {
    #[error("failed to serialize CustomResourceDefinition {name} as YAML")]
    Serialize {
        name: String,
        #[source]
        source: serde_norway::Error,
    },
    #[error("failed to write the CustomResourceDefinitions to stdout")]
    Write(#[source] std::io::Error),
}

/// Every CRD of vmop, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![VirtualMachine::crd(), ProviderConfig::crd()]
}

/// The file name under `crds/` for a CRD: `<group>_<plural>.yaml`, as controller-gen names them.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// One CRD as a YAML document (without a leading `---`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdsError> {
    serde_norway::to_string(crd).map_err(|source| CrdsError::Serialize {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// Prints all CRDs to stdout, separated by `---`.
pub fn print() -> anyhow::Result<()> {
    Ok(print_to_stdout()?)
}

fn print_to_stdout() -> Result<(), CrdsError> {
    use std::io::Write;
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&to_yaml(&crd)?);
    }
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(CrdsError::Write)
}
