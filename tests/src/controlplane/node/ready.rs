//! Waiting until the node takes Pods: its Node object exists, its `Ready` condition is `True`
//! and it carries no taint (the apiserver taints every new Node `not-ready` until the node
//! lifecycle controller sees it Ready).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// How the Node looked at the last poll, for the error when it never gets ready.
pub type LastSeen = String;

const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Polls the Node named `name` until it is Ready and untainted, `alive()` says a component
/// died (its description is returned as the error), or `timeout` passes (the error is how the
/// Node looked last).
pub async fn wait(
    client: kube::Client,
    name: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(), LastSeen> {
    let nodes: Api<Node> = Api::all(client);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        alive()?;
        let last_seen = match nodes.get_opt(name).await {
            Ok(Some(node)) => match describe_unready(&node) {
                None => return Ok(()),
                Some(why) => why,
            },
            Ok(None) => "not registered yet".to_owned(),
            Err(error) => format!("GET failed: {error}"),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(last_seen);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `None` when the Node is Ready and untainted, else what is missing.
fn describe_unready(node: &Node) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    let taints: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.as_ref())
        .map(|taints| {
            taints
                .iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default();
    match ready {
        Some(condition) if condition.status == "True" && taints.is_empty() => None,
        Some(condition) if condition.status == "True" => Some(format!("Ready, tainted {taints:?}")),
        Some(condition) => Some(format!(
            "Ready={} ({}: {}), taints {taints:?}",
            condition.status,
            condition.reason.as_deref().unwrap_or(""),
            condition.message.as_deref().unwrap_or("")
        )),
        None => Some(format!("no Ready condition yet, taints {taints:?}")),
    }
}
