//! The real control plane without the operator: the harness itself (CRDs, watches, RBAC,
//! tokens, garbage collection, kubectl, the standalone command), leader election and the layout
//! fence between in-process candidates, and the deploy manifests and Helm chart (server-side dry-run, Pod
//! Security admission, the operator's permissions; helm from `scripts/prepare.sh`).
//!
//! Every test works in a namespace of its own on the binary's shared control plane
//! (`ControlPlane::shared`), or starts a control plane it owns.

mod controlplane;
mod layout;
mod leader;
mod manifests;
