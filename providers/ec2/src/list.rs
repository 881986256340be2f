//! `list`: this cluster's live instances, one `DescribeInstances` page per call.
//!
//! The instances are those tagged `vmop.dev/cluster` = `config.cluster` in a live state
//! (`pending`, `running`, `stopping`, `stopped`: the states in which `get` answers them), at most
//! setting `listPageSize` of them (EC2's `MaxResults`, 5..=1000, default 1000); EC2's
//! `NextToken` is the cursor. Each is answered as `get` answers it, with its cluster tag and its
//! `launchTime` as the creation time. A call that names no cluster is refused: it would list
//! every cluster's instances.

use vmop_provider_sdk::bounds::MAX_PAGE_MACHINES;
use vmop_provider_sdk::error::permanent;
use vmop_provider_sdk::tags::TAG_CLUSTER;
use vmop_provider_sdk::{Config, Page, ProviderError};

use crate::instance::Instance;
use crate::lookup::LIVE_STATES;
use crate::query::{Api, CallError, Params};
use crate::xml;

/// The setting naming the page size.
pub const PAGE_SIZE_SETTING: &str = "listPageSize";
/// What EC2 allows as `MaxResults` of `DescribeInstances`; the top is the contract's page.
const PAGE_SIZES: std::ops::RangeInclusive<usize> = 5..=MAX_PAGE_MACHINES;

pub fn list(config: &Config, cursor: Option<&str>) -> Result<Page, ProviderError> {
    let cluster = config.require_cluster()?;
    let size = page_size(config)?;
    let ec2 = Api::ec2(config)?;
    let body = ec2.call("DescribeInstances", &params(cluster, size, cursor))?;
    let (instances, next) =
        xml::instance_page(&body).map_err(CallError::xml("DescribeInstances"))?;
    Ok(page(instances, next))
}

/// Setting `listPageSize`, default the largest page.
fn page_size(config: &Config) -> Result<usize, ProviderError> {
    let Some(value) = config.settings.get(PAGE_SIZE_SETTING) else {
        return Ok(*PAGE_SIZES.end());
    };
    value
        .trim()
        .parse()
        .ok()
        .filter(|size| PAGE_SIZES.contains(size))
        .ok_or_else(|| {
            permanent(format!(
                "setting `{PAGE_SIZE_SETTING}` is `{value}`, not a page size of {}..={} \
                 instances",
                PAGE_SIZES.start(),
                PAGE_SIZES.end()
            ))
        })
}

fn params(cluster: &str, size: usize, cursor: Option<&str>) -> Params {
    let mut params = Params::new();
    params
        .filter(1, &format!("tag:{TAG_CLUSTER}"), &[cluster])
        .filter(2, "instance-state-name", &LIVE_STATES)
        .push("MaxResults", size.to_string());
    if let Some(cursor) = cursor {
        params.push("NextToken", cursor);
    }
    params
}

/// The page of `instances`: those `get` answers (a state outside the filter, which EC2 may
/// still apply late, is left out), each as `get` answers it.
fn page(instances: Vec<Instance>, next: Option<String>) -> Page {
    Page {
        machines: instances
            .iter()
            .filter(|i| !i.is_gone())
            .map(Instance::to_listed)
            .collect(),
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(settings: &[(&str, &str)], cluster: &str) -> Config {
        Config {
            settings: settings.iter().copied().collect(),
            cluster: cluster.into(),
            ..Config::default()
        }
    }

    #[test]
    fn no_cluster_lists_nothing() {
        let refused = list(&config(&[("region", "r")], ""), None);
        assert!(matches!(refused, Err(ProviderError::Permanent(m)) if m.contains("cluster")));
    }

    #[test]
    fn the_page_size_is_ec2s_range() {
        assert_eq!(page_size(&config(&[], "c")).ok(), Some(1000));
        assert_eq!(
            page_size(&config(&[(PAGE_SIZE_SETTING, " 5")], "c")).ok(),
            Some(5)
        );
        for bad in ["4", "1001", "-5", "many"] {
            assert!(
                matches!(
                    page_size(&config(&[(PAGE_SIZE_SETTING, bad)], "c")),
                    Err(ProviderError::Permanent(m)) if m.contains("listPageSize")
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn asks_for_the_clusters_live_instances_after_the_cursor() {
        let pairs = |p: Params| -> Vec<(String, String)> { p.iter().cloned().collect() };
        let first = pairs(params("c-1", 5, None));
        let expected: Vec<(String, String)> = [
            ("Filter.1.Name", "tag:vmop.dev/cluster"),
            ("Filter.1.Value.1", "c-1"),
            ("Filter.2.Name", "instance-state-name"),
            ("Filter.2.Value.1", "pending"),
            ("Filter.2.Value.2", "running"),
            ("Filter.2.Value.3", "stopping"),
            ("Filter.2.Value.4", "stopped"),
            ("MaxResults", "5"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(first, expected);
        let next = pairs(params("c-1", 5, Some("tok")));
        assert_eq!(
            next.last(),
            Some(&("NextToken".to_owned(), "tok".to_owned()))
        );
    }

    #[test]
    fn answers_what_get_answers() {
        let instance = |id: &str, state: &str| Instance {
            id: id.into(),
            state: state.into(),
            cluster: Some("c-1".into()),
            ..Instance::default()
        };
        let page = page(
            vec![
                instance("i-1", "running"),
                instance("i-2", "shutting-down"),
                instance("i-3", "stopped"),
            ],
            Some("tok".into()),
        );
        let ids: Vec<&str> = page.machines.iter().map(|m| m.status.id.as_str()).collect();
        assert_eq!(ids, ["i-1", "i-3"]);
        assert_eq!(page.next.as_deref(), Some("tok"));
    }
}
