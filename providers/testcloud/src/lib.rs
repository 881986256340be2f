//! vmop provider plugin for the testcloud (`tests/src/cloud/`, binary `vmop-testcloud`): an
//! in-memory cloud with an HTTP JSON API. Written only against the SDK, to show what a new
//! REST cloud costs.
//!
//! ProviderConfig settings: `endpoint` (required, in `allowedHosts`), `tags`
//! (`key=value,...`, also a parameter) and `listPageSize` (machines per `list` page, 1..=1000,
//! default 1000). Credentials Secret: optional `token`, sent as a bearer token. Machines carry
//! vmop's tags (`vmop_provider_sdk::tags`), the call's cluster among them; `find` looks them up
//! by uid through `GET /v1/machines?uid=`, `create` is one conditional `POST` (`ifAbsent`: the
//! cloud answers the uid's machine if it has one), and the `vmop.dev/uid` tag is the machine's
//! `owner`. `list` pages through `GET /v1/machines?cluster=&limit=&after=`, the cloud's `next`
//! being the cursor. The testcloud makes every machine through vmop, so `update` has nothing
//! to claim. Its store answers a machine by id as soon as `create` returned it:
//! `consistent-get`.
//!
//! The same source builds against contract 0.2 (the fixture guest `testcloud-v02`, on
//! `vmop-provider-sdk-v02`): no `list`, no cluster tag.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vmop_provider_sdk::bounds::MAX_PAGE_MACHINES;
use vmop_provider_sdk::error::permanent;
use vmop_provider_sdk::http::Method;
use vmop_provider_sdk::json::{JsonApi, with_body};
use vmop_provider_sdk::url::encode_component;
use vmop_provider_sdk::{
    Config, ListedMachine, Page, Parameter, ParameterKind, Phase, PluginInfo, Provider,
    ProviderError, UpdateOutcome, VmSpec, VmStatus, WIT_VERSION, info, tags, warn,
};

const CAPABILITIES: [&str; 5] = ["user-data", "update", "power", "consistent-get", "list"];

/// The setting naming how many machines a `list` page asks for.
const PAGE_SIZE_SETTING: &str = "listPageSize";

/// A machine as the testcloud answers it (the fields this provider reads).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Machine {
    id: String,
    state: String,
    #[serde(default)]
    addresses: Vec<String>,
    /// The creation sequence number: orders machines, says nothing of time.
    #[serde(default)]
    created: u64,
    /// When the machine was made, in milliseconds since the Unix epoch, where the cloud says.
    #[serde(default)]
    created_at_ms: Option<u64>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

impl Machine {
    /// As `list` answers it: the status `get` answers, the cluster tag, the creation time.
    fn listed(mut self) -> ListedMachine {
        let cluster = self.tags.remove(tags::TAG_CLUSTER);
        let created_at_ms = self.created_at_ms;
        ListedMachine {
            status: self.status(),
            cluster,
            created_at_ms,
        }
    }

    fn status(self) -> VmStatus {
        let phase = match self.state.as_str() {
            "running" => Phase::Running,
            "stopped" => Phase::Stopped,
            _ => Phase::Unknown,
        };
        VmStatus {
            id: self.id,
            phase,
            addresses: self.addresses,
            message: None,
            owner: self.tags.get(tags::TAG_UID).cloned(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct List {
    machines: Vec<Machine>,
}

/// One page of a listing; `next` is the id to list `after`, `None` on the last page.
#[derive(Debug, Deserialize)]
struct Listing {
    machines: Vec<Machine>,
    #[serde(default)]
    next: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct NewMachine<'a> {
    uid: &'a str,
    image: &'a str,
    cpu: u32,
    memory_mib: u64,
    user_data: Option<&'a str>,
    tags: BTreeMap<&'a str, &'a str>,
    if_absent: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Resize {
    cpu: u32,
    memory_mib: u64,
}

fn api(config: &Config) -> Result<JsonApi, ProviderError> {
    let endpoint = config.settings.require_url("endpoint")?;
    Ok(JsonApi::new(endpoint).with_bearer(config.secrets.get("token")))
}

fn machine(id: &str) -> String {
    format!("/v1/machines/{}", encode_component(id))
}

/// The oldest machine made for `uid` (several only after racing creates).
fn by_uid(api: &JsonApi, uid: &str) -> Result<Option<Machine>, ProviderError> {
    let list: List = api.fetch(&format!("/v1/machines?uid={}", encode_component(uid)))?;
    if list.machines.len() > 1 {
        warn!(
            "{} machines carry uid {uid}; using the oldest",
            list.machines.len()
        );
    }
    Ok(tags::oldest(list.machines, |m| m.created))
}

struct TestCloud;

impl Provider for TestCloud {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "testcloud".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            wit_version: WIT_VERSION.to_owned(),
            capabilities: CAPABILITIES.map(str::to_owned).to_vec(),
            parameters: vec![Parameter {
                name: "tags".to_owned(),
                kind: ParameterKind::Text,
                description: "extra machine tags, comma-separated key=value".to_owned(),
                // Tags are set at creation only.
                mutable: false,
            }],
        }
    }

    /// `testcloud:<endpoint>`: one testcloud is one location.
    fn location(config: &Config) -> Result<String, ProviderError> {
        let endpoint = api(config)?.base().to_string();
        Ok(format!("testcloud:{}", endpoint.trim_end_matches('/')))
    }

    fn find(config: &Config, uid: &str) -> Result<Option<VmStatus>, ProviderError> {
        Ok(by_uid(&api(config)?, uid)?.map(Machine::status))
    }

    /// Idempotent in one request: with `ifAbsent` the testcloud makes the machine only if the
    /// uid has none, and otherwise answers the uid's oldest.
    fn create(config: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError> {
        let api = api(config)?;
        let settings = config.settings.with_overrides(&spec.parameters);
        let body = NewMachine {
            uid: &spec.uid,
            image: &spec.image,
            cpu: spec.cpu,
            memory_mib: spec.memory_mib,
            user_data: spec.user_data.as_deref(),
            tags: tags::for_spec(&spec, &config.cluster, settings.get("tags"))?
                .into_iter()
                .collect(),
            if_absent: true,
        };
        let made: Machine = api.post("/v1/machines", &body)?;
        info!("created {} for {}/{}", made.id, spec.namespace, spec.name);
        Ok(made.status())
    }

    fn get(config: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError> {
        Ok(api(config)?
            .get::<Machine>(&machine(id))?
            .map(Machine::status))
    }

    /// The testcloud resizes only a stopped machine and answers 409 for a running one.
    fn update(config: &Config, id: &str, spec: VmSpec) -> Result<UpdateOutcome, ProviderError> {
        let api = api(config)?;
        let resize = Resize {
            cpu: spec.cpu,
            memory_mib: spec.memory_mib,
        };
        let request = with_body(api.request(Method::Patch, &machine(id)), &resize)?;
        let response = api.send(&request)?;
        if response.status == 409 {
            return Ok(UpdateOutcome::NeedsRestart);
        }
        JsonApi::check(&request, response)?;
        Ok(UpdateOutcome::Applied)
    }

    fn start(config: &Config, id: &str) -> Result<(), ProviderError> {
        power(config, id, "start")
    }

    fn stop(config: &Config, id: &str) -> Result<(), ProviderError> {
        power(config, id, "stop")
    }

    fn delete(config: &Config, id: &str) -> Result<(), ProviderError> {
        api(config)?.delete(&machine(id)).map(drop)
    }

    /// The machines tagged with the call's cluster, in the cloud's id order, `listPageSize`
    /// at a time.
    fn list(config: &Config, cursor: Option<String>) -> Result<Page, ProviderError> {
        let cluster = config.require_cluster()?;
        let size = page_size(config)?;
        let mut path = format!(
            "/v1/machines?cluster={}&limit={size}",
            encode_component(cluster)
        );
        if let Some(after) = cursor {
            path.push_str(&format!("&after={}", encode_component(&after)));
        }
        let listing: Listing = api(config)?.fetch(&path)?;
        Ok(Page {
            machines: listing.machines.into_iter().map(Machine::listed).collect(),
            next: listing.next,
        })
    }
}

/// Setting `listPageSize` (1..=1000), default 1000.
fn page_size(config: &Config) -> Result<usize, ProviderError> {
    let Some(value) = config.settings.get(PAGE_SIZE_SETTING) else {
        return Ok(MAX_PAGE_MACHINES);
    };
    value
        .trim()
        .parse()
        .ok()
        .filter(|size| (1..=MAX_PAGE_MACHINES).contains(size))
        .ok_or_else(|| {
            permanent(format!(
                "setting `{PAGE_SIZE_SETTING}` is `{value}`, not a page size of \
                 1..={MAX_PAGE_MACHINES} machines"
            ))
        })
}

/// `POST /v1/machines/{id}/start|stop` (idempotent in the testcloud).
fn power(config: &Config, id: &str, action: &str) -> Result<(), ProviderError> {
    let api = api(config)?;
    let request = api.request(Method::Post, &format!("{}/{action}", machine(id)));
    JsonApi::check(&request, api.send(&request)?).map(drop)
}

vmop_provider_sdk::export_provider!(TestCloud);
