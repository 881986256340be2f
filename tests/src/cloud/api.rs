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

#[derive(Debug, Serialize)]
struct List {
    machines: Vec<super::Machine>,
}

/// `GET /v1/machines?uid=U`: the machines of one uid through the index; without `uid`, all.
fn list(shared: &Shared, query: Option<&str>) -> Response {
    let uid = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("uid="))
        .map(percent_decode);
    let store = shared.store();
    let machines = match uid {
        Some(Some(uid)) => store.by_uid(&uid),
        Some(None) => {
            drop(store);
            return refuse(
                StatusCode::BAD_REQUEST,
                "bad-request",
                "uid is not valid percent-encoded UTF-8",
            );
        }
        None => store.all(),
    };
    drop(store);
    json(StatusCode::OK, &List { machines })
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
    use super::percent_decode;

    #[test]
    fn decodes_query_values() {
        assert_eq!(percent_decode("a%2Fb+c").as_deref(), Some("a/b c"));
        assert_eq!(percent_decode("6f1c-00").as_deref(), Some("6f1c-00"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}
