//! The testcloud's HTTP JSON API (see the module docs of [`crate::cloud`]): routing, the
//! bearer token, the latency, the throttles and the answers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::rate::{Bucket, Class, Ec2Buckets, Refused, Resource};
use super::store::{NewMachine, Power, Resize, ResizeError, Store};
use super::{Config, Ec2Limits, RateLimit};

/// What every request handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub store: Mutex<Store>,
    pub bucket: Option<Mutex<Bucket>>,
    pub ec2: Option<Mutex<Ec2Buckets>>,
    /// The state of the latency draws (splitmix64), seeded from the clock.
    draws: AtomicU64,
    /// A fault a test injects: paged listings answer 503 (see [`super::Cloud::refuse_listings`]).
    pub refuse_listings: AtomicBool,
}

impl Shared {
    pub fn new(config: Config) -> Self {
        let bucket = config
            .rate_limit
            .map(|limit| Mutex::new(Bucket::new(limit.per_second, limit.burst)));
        let ec2 = config.ec2.as_ref().map(|l| Mutex::new(Ec2Buckets::new(l)));
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64);
        Shared {
            config,
            store: Mutex::new(Store::default()),
            bucket,
            ec2,
            draws: AtomicU64::new(seed),
            refuse_listings: AtomicBool::new(false),
        }
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// This answer's delay: [`Config::latency`], or a uniform draw up to
    /// [`Config::latency_max`] when that is greater.
    fn latency(&self) -> Duration {
        let (min, max) = (self.config.latency, self.config.latency_max);
        if max <= min {
            return min;
        }
        // splitmix64: a lock-free, well-mixed sequence, enough for spreading delays.
        let mut z = self
            .draws
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64; // in [0, 1)
        min + (max - min).mul_f64(unit)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `{"error", "message"}` body of every refusal.
#[derive(Debug, Serialize)]
struct ApiError<'a> {
    error: &'a str,
    message: String,
}

fn json(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(err) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot encode the answer: {err}"),
        ),
    }
}

fn refuse(status: StatusCode, error: &str, message: impl Into<String>) -> Response {
    let body = ApiError {
        error,
        message: message.into(),
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn not_found(id: &str) -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "not-found",
        format!("no machine {id}"),
    )
}

/// The single handler: the route table is small enough to match by hand, which keeps every
/// refusal (a bad path, a bad body) in the API's own JSON shape.
///
/// In order: the latency (no lock held while waiting), the counts, the plain rate limit, the
/// EC2-like buckets, the bearer token, the route.
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let delay = shared.latency();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (class, resource) = classify(&method, uri.path());
    {
        let stats = &mut shared.store().stats;
        stats.requests += 1;
        match class {
            Class::Read => stats.reads += 1,
            Class::Mutate => stats.mutates += 1,
            Class::Harness => {}
        }
    }
    if let Some(refused) = throttled(&shared, class, resource) {
        let stats = &mut shared.store().stats;
        stats.throttled += 1;
        match class {
            Class::Read => stats.throttled_reads += 1,
            Class::Mutate => stats.throttled_mutates += 1,
            Class::Harness => {}
        }
        if refused.by_resource {
            stats.throttled_by_resource += 1;
        }
        return too_many(refused.wait);
    }
    if let Some(token) = &shared.config.token {
        let expected = format!("Bearer {token}");
        let given = headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        if given != Some(expected.as_bytes()) {
            shared.store().stats.unauthorized += 1;
            return refuse(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            );
        }
    }
    route(&shared, &method, &uri, &body)
}

/// 429 with `Retry-After`: `wait` rounded up to whole seconds, at least one.
fn too_many(wait: Duration) -> Response {
    let mut response = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        "rate-limited",
        "request rate exceeded",
    );
    let seconds = wait.as_secs_f64().ceil().max(1.0);
    if let Ok(value) = HeaderValue::from_str(&format!("{seconds:.0}")) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The request's class and, for a create or a delete, its resource bucket.
fn classify(method: &Method, path: &str) -> (Class, Option<Resource>) {
    let rest = path.strip_prefix("/v1/").unwrap_or(path);
    if rest == "stats" || rest == "limits" || rest.starts_with("limits/") {
        return (Class::Harness, None);
    }
    let segments: Vec<&str> = rest.split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET" | "HEAD", _) => (Class::Read, None),
        ("POST", ["machines"]) => (Class::Mutate, Some(Resource::Run)),
        ("DELETE", ["machines", _]) => (Class::Mutate, Some(Resource::Terminate)),
        _ => (Class::Mutate, None),
    }
}

/// Why the request may not go on: the plain rate limit first (every request), then the
/// EC2-like buckets.
fn throttled(shared: &Shared, class: Class, resource: Option<Resource>) -> Option<Refused> {
    if let Some(bucket) = &shared.bucket
        && let Err(wait) = lock(bucket).take()
    {
        return Some(Refused {
            wait,
            by_resource: false,
        });
    }
    lock(shared.ec2.as_ref()?).take(class, resource).err()
}

/// The answer of `GET /v1/limits`: the throttles and the latency this cloud was started with.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Limits {
    rate_limit: Option<RateLimit>,
    ec2: Option<Ec2Limits>,
    latency_min_ms: f64,
    latency_max_ms: f64,
}

fn limits(config: &Config) -> Limits {
    let min = config.latency;
    Limits {
        rate_limit: config.rate_limit,
        ec2: config.ec2,
        latency_min_ms: min.as_secs_f64() * 1000.0,
        latency_max_ms: config.latency_max.max(min).as_secs_f64() * 1000.0,
    }
}

/// `POST /v1/limits/refill`: every bucket full again.
fn refill(shared: &Shared) -> Response {
    if let Some(bucket) = &shared.bucket {
        lock(bucket).refill();
    }
    if let Some(buckets) = &shared.ec2 {
        lock(buckets).refill();
    }
    StatusCode::NO_CONTENT.into_response()
}

fn route(shared: &Shared, method: &Method, uri: &Uri, body: &[u8]) -> Response {
    let Some(rest) = uri.path().strip_prefix("/v1/") else {
        return no_route(method, uri);
    };
    let segments: Vec<&str> = rest.split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["machines"]) => list(shared, uri.query()),
        ("POST", ["machines"]) => create(shared, body),
        ("GET", ["machines", id]) => match shared.store().get(id) {
            Some(machine) => json(StatusCode::OK, machine),
            None => not_found(id),
        },
        ("DELETE", ["machines", id]) => {
            if shared.store().delete(id) {
                StatusCode::NO_CONTENT.into_response()
            } else {
                not_found(id)
            }
        }
        ("PATCH", ["machines", id]) => resize(shared, id, body),
        ("POST", ["machines", id, action @ ("start" | "stop")]) => {
            let state = if *action == "start" {
                Power::Running
            } else {
                Power::Stopped
            };
            match shared.store().power(id, state) {
                Some(machine) => json(StatusCode::OK, &machine),
                None => not_found(id),
            }
        }
        ("GET", ["stats"]) => json(StatusCode::OK, &shared.store().stats),
        ("GET", ["limits"]) => json(StatusCode::OK, &limits(&shared.config)),
        ("POST", ["limits", "refill"]) => refill(shared),
        _ => no_route(method, uri),
    }
}

fn no_route(method: &Method, uri: &Uri) -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "no-route",
        format!("no route {method} {}", uri.path()),
    )
}

/// The answer of `GET /v1/machines?uid=U`.
#[derive(Debug, Serialize)]
struct List {
    machines: Vec<super::Machine>,
}

/// The answer of a paged `GET /v1/machines`: `next` is `null` on the last page.
#[derive(Debug, Serialize)]
struct PageAnswer {
    machines: Vec<super::Machine>,
    next: Option<String>,
}

/// The most machines one page holds, and what a listing without `limit` gets.
pub(crate) const MAX_PAGE: usize = 1000;

/// The raw value of the query's first `name=` parameter.
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

/// `GET /v1/machines?uid=U`: the machines of one uid through the index, all of them, oldest
/// first, `{"machines"}`. Otherwise a page (`cluster`, `after`, `limit`: see
/// [`super::store::Store::page`]), `{"machines", "next"}`.
fn list(shared: &Shared, query: Option<&str>) -> Response {
    let params = (|| {
        Ok::<_, String>((
            decoded_param(query, "uid")?,
            decoded_param(query, "cluster")?,
            decoded_param(query, "after")?,
        ))
    })();
    let (uid, cluster, after) = match params {
        Ok(params) => params,
        Err(message) => return bad_query(message),
    };
    if let Some(uid) = uid {
        let machines = shared.store().by_uid(&uid);
        return json(StatusCode::OK, &List { machines });
    }
    if shared.refuse_listings.load(Ordering::Relaxed) {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "listings are refused for now",
        );
    }
    let limit = match query_param(query, "limit").map(str::parse::<usize>) {
        None => MAX_PAGE,
        Some(Ok(limit)) if (1..=MAX_PAGE).contains(&limit) => limit,
        Some(_) => return bad_query(format!("limit must be an integer in 1..={MAX_PAGE}")),
    };
    let page = shared
        .store()
        .page(cluster.as_deref(), after.as_deref(), limit);
    json(
        StatusCode::OK,
        &PageAnswer {
            machines: page.machines,
            next: page.next,
        },
    )
}

/// The percent-decoded value of the query's `name` parameter, or why it does not decode.
fn decoded_param(query: Option<&str>, name: &str) -> Result<Option<String>, String> {
    query_param(query, name)
        .map(|value| {
            percent_decode(value)
                .ok_or_else(|| format!("{name} is not valid percent-encoded UTF-8"))
        })
        .transpose()
}

fn bad_query(message: impl Into<String>) -> Response {
    refuse(StatusCode::BAD_REQUEST, "bad-request", message)
}

fn create(shared: &Shared, body: &[u8]) -> Response {
    let new: NewMachine = match serde_json::from_slice(body) {
        Ok(new) => new,
        Err(err) => return bad_body(&err),
    };
    if new.uid.is_empty() || new.cpu == 0 || new.memory_mib == 0 {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "uid, cpu and memoryMib must be non-empty and non-zero",
        );
    }
    if !shared.config.images.contains(&new.image) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown-image",
            format!("no image {:?}", new.image),
        );
    }
    match shared.store().create_if_absent(new) {
        (machine, true) => json(StatusCode::CREATED, &machine),
        (machine, false) => json(StatusCode::OK, &machine),
    }
}

fn resize(shared: &Shared, id: &str, body: &[u8]) -> Response {
    let resize: Resize = match serde_json::from_slice(body) {
        Ok(resize) => resize,
        Err(err) => return bad_body(&err),
    };
    if resize.cpu == Some(0) || resize.memory_mib == Some(0) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "cpu and memoryMib must be non-zero",
        );
    }
    let result = shared.store().resize(id, &resize);
    match result {
        Ok(machine) => json(StatusCode::OK, &machine),
        Err(ResizeError::NotFound) => not_found(id),
        Err(ResizeError::Running) => refuse(
            StatusCode::CONFLICT,
            "running",
            format!("machine {id} must be stopped to change its size"),
        ),
    }
}

fn bad_body(err: &serde_json::Error) -> Response {
    refuse(
        StatusCode::BAD_REQUEST,
        "bad-request",
        format!("the body is not the expected JSON: {err}"),
    )
}

/// `%XX` and `+` decoded; `None` for a bad escape or invalid UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut input = text.bytes();
    while let Some(b) = input.next() {
        match b {
            b'%' => {
                let hex = [input.next()?, input.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
            }
            b'+' => bytes.push(b' '),
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use axum::body::to_bytes;
    use serde_json::Value;

    use super::*;
    use crate::cloud::store::CLUSTER_TAG;

    #[test]
    fn decodes_query_values() {
        assert_eq!(percent_decode("a%2Fb+c").as_deref(), Some("a/b c"));
        assert_eq!(percent_decode("6f1c-00").as_deref(), Some("6f1c-00"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None);
    }

    #[test]
    fn finds_query_parameters_by_whole_name() {
        let q = Some("xlimit=3&limit=5&after=tc-1&limit=7");
        assert_eq!(query_param(q, "limit"), Some("5"));
        assert_eq!(query_param(q, "after"), Some("tc-1"));
        assert_eq!(query_param(q, "cluster"), None);
        assert_eq!(query_param(None, "uid"), None);
    }

    /// A cloud whose machines 0, 2, 4.. are in cluster `a/1` and the others in `b`.
    fn cloud(machines: usize) -> Shared {
        let shared = Shared::new(Config::default());
        for i in 0..machines {
            let cluster = if i % 2 == 0 { "a/1" } else { "b" };
            shared.store().create(NewMachine {
                uid: format!("u{i}"),
                image: super::super::IMAGE.to_owned(),
                cpu: 1,
                memory_mib: 512,
                user_data: None,
                tags: BTreeMap::from([(CLUSTER_TAG.to_owned(), cluster.to_owned())]),
                if_absent: false,
            });
        }
        shared
    }

    async fn get(shared: &Shared, path_and_query: &str) -> (StatusCode, Value) {
        let uri: Uri = path_and_query.parse().unwrap_or_default();
        let response = route(shared, &Method::GET, &uri, &[]);
        let status = response.status();
        let body = to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    fn ids(answer: &Value) -> Vec<String> {
        answer
            .get("machines")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
            .collect()
    }

    #[tokio::test]
    async fn a_listing_pages_by_cluster_through_next() {
        let shared = cloud(9);
        let mut seen = Vec::new();
        let mut query = "/v1/machines?cluster=a%2F1&limit=2".to_owned();
        loop {
            let (status, answer) = get(&shared, &query).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            seen.extend(ids(&answer));
            match answer.get("next") {
                Some(Value::String(next)) => {
                    query = format!("/v1/machines?cluster=a%2F1&limit=2&after={next}");
                }
                Some(Value::Null) => break,
                _ => panic!("no next in {answer}"),
            }
        }
        let expected: Vec<String> = shared
            .store()
            .all()
            .into_iter()
            .filter(|m| m.tags.get(CLUSTER_TAG).map(String::as_str) == Some("a/1"))
            .map(|m| m.id)
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(seen.len(), 5);
    }

    #[tokio::test]
    async fn a_listing_without_parameters_is_the_first_page_of_all() {
        let shared = cloud(3);
        let (status, answer) = get(&shared, "/v1/machines").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ids(&answer).len(), 3);
        assert_eq!(answer.get("next"), Some(&Value::Null), "{answer}");
        let machine = answer.pointer("/machines/0").cloned().unwrap_or_default();
        let expected = serde_json::json!({
            "id": "tc-00000001",
            "uid": "u0",
            "image": super::super::IMAGE,
            "cpu": 1,
            "memoryMib": 512,
            "state": "running",
            "tags": {CLUSTER_TAG: "a/1"},
            "addresses": ["10.0.0.1"],
            "created": 1,
        });
        assert_eq!(machine, expected);
    }

    #[tokio::test]
    async fn a_listing_by_uid_answers_as_before() {
        let shared = cloud(3);
        let (status, answer) = get(&shared, "/v1/machines?uid=u1&limit=1").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ids(&answer).len(), 1);
        assert!(answer.get("next").is_none(), "{answer}");
        let (status, _) = get(&shared, "/v1/machines?uid=%zz").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn a_limit_out_of_range_is_refused() {
        let shared = cloud(1);
        for limit in ["0", "1001", "-1", "x", ""] {
            let (status, answer) = get(&shared, &format!("/v1/machines?limit={limit}")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "limit={limit}");
            assert_eq!(answer.get("error"), Some(&Value::from("bad-request")));
        }
        for limit in ["1", "1000"] {
            let (status, _) = get(&shared, &format!("/v1/machines?limit={limit}")).await;
            assert_eq!(status, StatusCode::OK, "limit={limit}");
        }
        let (status, _) = get(&shared, "/v1/machines?after=%zz").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    async fn call(shared: &Arc<Shared>, method: Method, path: &str, body: &str) -> Response {
        let uri: Uri = path.parse().unwrap_or_default();
        let body = Bytes::copy_from_slice(body.as_bytes());
        handle(State(shared.clone()), method, uri, HeaderMap::new(), body).await
    }

    const NEW: &str = r#"{"uid": "u", "image": "tc-ubuntu-24.04", "cpu": 1, "memoryMib": 512}"#;

    #[tokio::test]
    async fn the_ec2_buckets_throttle_and_count_by_class() {
        // Refills too slow to matter within the test.
        let slow = |burst| RateLimit {
            per_second: 0.001,
            burst,
        };
        let limits = Ec2Limits {
            read: slow(2),
            mutate: slow(3),
            run: slow(1),
            terminate: slow(5),
        };
        let shared = Arc::new(Shared::new(Config::default().with_ec2(limits)));
        let created = call(&shared, Method::POST, "/v1/machines", NEW).await;
        assert_eq!(created.status(), StatusCode::CREATED);
        // The run bucket (1) is empty: a second create is refused by it.
        let refused = call(&shared, Method::POST, "/v1/machines", NEW).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry_after = refused.headers().get(header::RETRY_AFTER).cloned();
        assert_eq!(retry_after, Some(HeaderValue::from_static("1000")));
        // Deletes have their own resource bucket; the mutate bucket (3) has 2 left.
        let gone = call(&shared, Method::DELETE, "/v1/machines/tc-00000001", "").await;
        assert_eq!(gone.status(), StatusCode::NO_CONTENT);
        let missing = call(&shared, Method::DELETE, "/v1/machines/tc-00000001", "").await;
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        let refused = call(&shared, Method::DELETE, "/v1/machines/tc-00000001", "").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        for expected in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let listed = call(&shared, Method::GET, "/v1/machines?limit=5", "").await;
            assert_eq!(listed.status(), expected);
        }
        // The harness's routes are neither throttled nor counted as calls.
        for _ in 0..5 {
            let stats = call(&shared, Method::GET, "/v1/stats", "").await;
            assert_eq!(stats.status(), StatusCode::OK);
        }
        let stats = shared.store().stats;
        assert_eq!((stats.reads, stats.mutates), (3, 5));
        assert_eq!((stats.throttled_reads, stats.throttled_mutates), (1, 2));
        assert_eq!((stats.throttled, stats.throttled_by_resource), (3, 1));
        assert_eq!(stats.requests, 13);
        // A refill makes every bucket full again.
        let refilled = call(&shared, Method::POST, "/v1/limits/refill", "").await;
        assert_eq!(refilled.status(), StatusCode::NO_CONTENT);
        let created = call(&shared, Method::POST, "/v1/machines", NEW).await;
        assert_eq!(created.status(), StatusCode::CREATED);
        let listed = call(&shared, Method::GET, "/v1/machines", "").await;
        assert_eq!(listed.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn the_limits_route_says_what_the_cloud_was_started_with() {
        let config = Config::default()
            .with_ec2(Ec2Limits::EC2.scaled(0.5))
            .with_latency_range(Duration::from_millis(50), Duration::from_millis(200));
        let shared = Shared::new(config);
        let (status, answer) = get(&shared, "/v1/limits").await;
        assert_eq!(status, StatusCode::OK);
        let expected = serde_json::json!({
            "rateLimit": null,
            "ec2": {
                "read": {"perSecond": 10.0, "burst": 50},
                "mutate": {"perSecond": 2.5, "burst": 100},
                "run": {"perSecond": 1.0, "burst": 500},
                "terminate": {"perSecond": 10.0, "burst": 500},
            },
            "latencyMinMs": 50.0,
            "latencyMaxMs": 200.0,
        });
        assert_eq!(answer, expected);
    }

    #[test]
    fn latencies_are_drawn_within_the_range() {
        let (min, max) = (Duration::from_millis(50), Duration::from_millis(200));
        let shared = Shared::new(Config::default().with_latency_range(min, max));
        let draws: Vec<Duration> = (0..1000).map(|_| shared.latency()).collect();
        assert!(draws.iter().all(|d| (min..=max).contains(d)), "{draws:?}");
        let low = draws
            .iter()
            .filter(|d| **d < Duration::from_millis(125))
            .count();
        assert!((350..=650).contains(&low), "{low} of 1000 below the middle");
        let fixed = Shared::new(Config::default().with_latency(min));
        assert_eq!(fixed.latency(), min);
    }
}
