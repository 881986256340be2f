//! API writes as the API server counts them (`apiserver_request_total` on its own `/metrics`):
//! what a benchmark or a regression test compares, deterministic unlike time.

use std::collections::BTreeMap;

use kube::Client;

/// Write requests (POST, PUT, PATCH, APPLY, DELETE; failed ones too) so far, by
/// `VERB resource[/subresource]`, leases excluded (leader election is not per VM).
pub async fn api_writes(client: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |key: &str| {
            let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
            let end = labels.get(start..)?.find('"')? + start;
            labels.get(start..end)
        };
        let verb = label("verb").unwrap_or_default();
        let resource = label("resource").unwrap_or_default();
        if !matches!(verb, "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE") || resource == "leases" {
            continue;
        }
        let key = match label("subresource").unwrap_or_default() {
            "" => format!("{verb} {resource}"),
            sub => format!("{verb} {resource}/{sub}"),
        };
        *out.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// The sum of `writes` to `resource[/subresource]`, whatever the verb.
pub fn to(writes: &BTreeMap<String, f64>, resource: &str) -> f64 {
    writes
        .iter()
        .filter(|(key, _)| key.split_once(' ').is_some_and(|(_, r)| r == resource))
        .map(|(_, n)| n)
        .sum()
}
