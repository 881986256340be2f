//! The testcloud's HTTP JSON API (see the module docs of [`crate::cloud`]): routing, the
//! bearer token, the rate limit and the answers.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::Config;
use super::rate::Bucket;
use super::store::{NewMachine, Power, Resize, ResizeError, Store};

/// What every request handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub store: Mutex<Store>,
    pub bucket: Option<Mutex<Bucket>>,
}

impl Shared {
    pub fn new(config: Config) -> Self {
        let bucket = config
            .rate_limit
            .map(|limit| Mutex::new(Bucket::new(limit.per_second, limit.burst)));
        Shared {
            config,
            store: Mutex::new(Store::default()),
            bucket,
        }
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
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
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !shared.config.latency.is_zero() {
        tokio::time::sleep(shared.config.latency).await;
    }
    shared.store().stats.requests += 1;
    if let Some(wait) = throttled(&shared) {
        shared.store().stats.throttled += 1;
        let mut response = refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "request rate exceeded",
        );
        let seconds = wait.as_secs_f64().ceil().max(1.0);
        if let Ok(value) = HeaderValue::from_str(&format!("{seconds:.0}")) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
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

fn throttled(shared: &Shared) -> Option<Duration> {
    lock(shared.bucket.as_ref()?).take().err()
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
}
