//! The span every reconcile runs in, so that each log line of a reconcile (the operator's own
//! and its plugin's) says which object and which ProviderConfig it concerns.

use super::labels::ControllerKind;

/// `reconcile{controller, namespace, object, provider_config}`. The object's name is recorded
/// as `object`, not `name`: tracing's JSON format writes the span's own name under `name` in
/// the same JSON object, so a `name` field would be a duplicate key that log pipelines resolve
/// to the span name. Only names go in here, never settings or credentials.
pub fn reconcile_span(
    controller: ControllerKind,
    namespace: Option<&str>,
    object: &str,
    provider_config: Option<&str>,
) -> tracing::Span {
    tracing::info_span!(
        "reconcile",
        controller = controller.as_str(),
        namespace,
        object,
        provider_config,
    )
}
