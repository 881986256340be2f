//! JSON over HTTP, for clouds with a REST API (feature `json`): a [`JsonApi`] client bound to
//! one endpoint and credential, and [`encode`]/[`decode`] for bodies.
//!
//! Errors follow the contract's classes: a status is classified by
//! [`crate::status::error_for_status`] with a message naming the request
//! (`GET /v1/machines/m-1: HTTP 401: ...`); a success whose body is not the expected JSON is
//! `transient` (the cloud answered something this provider does not understand, which a
//! retry or a fixed cloud may change); a body this provider cannot encode is `permanent`.
//!
//! ```ignore
//! let api = JsonApi::new(config.settings.require_url("endpoint")?)
//!     .with_bearer(config.secrets.get("token"));
//! let machine: Option<Machine> = api.get(&format!("/v1/machines/{}", encode_component(id)))?;
//! ```
//!
//! [`encode_component`]: crate::url::encode_component

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ProviderError;
use crate::error::{permanent, transient};
use crate::http::{Client, Method, Request, Response};
use crate::status::error_for_status;
use crate::url::Url;

/// How much of an error body a message quotes (the contract bounds messages to 1024 bytes).
const QUOTED_BODY_CHARS: usize = 512;

/// A REST endpoint speaking JSON, with an optional bearer token.
///
/// `Debug` does not show the token.
#[derive(Clone)]
pub struct JsonApi {
    base: Url,
    authorization: Option<String>,
    client: Client,
}

impl std::fmt::Debug for JsonApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonApi")
            .field("base", &self.base)
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .field("client", &self.client)
            .finish()
    }
}

impl JsonApi {
    /// Requests go to paths under `base` (see [`Url::join`]), with the default [`Client`].
    pub fn new(base: Url) -> Self {
        JsonApi {
            base,
            authorization: None,
            client: Client::default(),
        }
    }

    /// Sends `Authorization: Bearer <token>` with every request; `None` sends none.
    pub fn with_bearer(mut self, token: Option<&str>) -> Self {
        self.authorization = token.map(|t| format!("Bearer {t}"));
        self
    }

    /// Timeouts and response-size bound of every request.
    pub fn with_client(mut self, client: Client) -> Self {
        self.client = client;
        self
    }

    pub fn base(&self) -> &Url {
        &self.base
    }

    /// A request for `path` (and query) under the base, accepting JSON and carrying the
    /// credential.
    pub fn request(&self, method: Method, path: &str) -> Request {
        let request =
            Request::new(method, self.base.join(path)).header("accept", "application/json");
        match &self.authorization {
            Some(value) => request.header("authorization", value.clone()),
            None => request,
        }
    }

    /// Sends `request`; any status is an answer (see [`JsonApi::check`]), a transport failure
    /// is classified by [`crate::http::HttpError`]'s conversion.
    pub fn send(&self, request: &Request) -> Result<Response, ProviderError> {
        self.client.send(request).map_err(ProviderError::from)
    }

    /// The response if it succeeded (1xx–3xx), else its error class with a message naming
    /// the request and quoting the start of the body.
    pub fn check(request: &Request, response: Response) -> Result<Response, ProviderError> {
        let body: String = response.text().chars().take(QUOTED_BODY_CHARS).collect();
        let message = format!(
            "{} {}: HTTP {}: {}",
            request.method.as_str(),
            request.url.path(),
            response.status,
            body.trim()
        );
        match error_for_status(response.status, response.header("retry-after"), message) {
            Some(error) => Err(error),
            None => Ok(response),
        }
    }

    /// Sends `request` and decodes a successful answer as `T`.
    pub fn call<T: DeserializeOwned>(&self, request: &Request) -> Result<T, ProviderError> {
        let response = Self::check(request, self.send(request)?)?;
        decode(request, &response)
    }

    /// `GET path` as `T`; every error status, 404 included, is an error (a list, a search).
    pub fn fetch<T: DeserializeOwned>(&self, path: &str) -> Result<T, ProviderError> {
        self.call(&self.request(Method::Get, path))
    }

    /// `GET path` as `T`; `None` when the cloud answers 404 (one resource by id).
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, ProviderError> {
        let request = self.request(Method::Get, path);
        let response = self.send(&request)?;
        if response.status == 404 {
            return Ok(None);
        }
        decode(&request, &Self::check(&request, response)?).map(Some)
    }

    /// `POST path` with `body` as JSON, the answer as `T`.
    pub fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ProviderError> {
        self.call(&with_body(self.request(Method::Post, path), body)?)
    }

    /// `PATCH path` with `body` as JSON, the answer as `T`.
    pub fn patch<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ProviderError> {
        self.call(&with_body(self.request(Method::Patch, path), body)?)
    }

    /// `DELETE path`: `true` when deleted, `false` when the cloud answers 404 (already gone:
    /// the contract's delete succeeds then too).
    pub fn delete(&self, path: &str) -> Result<bool, ProviderError> {
        let request = self.request(Method::Delete, path);
        let response = self.send(&request)?;
        if response.status == 404 {
            return Ok(false);
        }
        Self::check(&request, response).map(|_| true)
    }
}

/// `request` with `body` as its JSON body and `content-type: application/json`.
pub fn with_body<B: Serialize + ?Sized>(
    request: Request,
    body: &B,
) -> Result<Request, ProviderError> {
    Ok(request
        .header("content-type", "application/json")
        .body(encode(body)?))
}

/// `value` as JSON; a value serde cannot encode (a map with non-string keys) is this
/// provider's bug: `permanent`.
pub fn encode<B: Serialize + ?Sized>(value: &B) -> Result<Vec<u8>, ProviderError> {
    serde_json::to_vec(value).map_err(|e| permanent(format!("cannot encode a request body: {e}")))
}

/// The body of `response` (to `request`) as `T`; a body that is not that JSON is `transient`.
pub fn decode<T: DeserializeOwned>(
    request: &Request,
    response: &Response,
) -> Result<T, ProviderError> {
    serde_json::from_slice(&response.body).map_err(|e| {
        transient(format!(
            "{} {}: the answer is not the expected JSON: {e}",
            request.method.as_str(),
            request.url.path()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Machine {
        id: String,
    }

    fn api() -> JsonApi {
        JsonApi::new(Url::parse("http://127.0.0.1:1/api").unwrap()).with_bearer(Some("s3cret"))
    }

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: vec![("retry-after".into(), b"2".to_vec())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn requests_carry_the_path_credential_and_body() {
        let request = with_body(api().request(Method::Post, "/v1/machines"), &[1, 2]).unwrap();
        assert_eq!(
            request.url.to_string(),
            "http://127.0.0.1:1/api/v1/machines"
        );
        let header = |name| {
            request
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("authorization"), Some("Bearer s3cret"));
        assert_eq!(header("content-type"), Some("application/json"));
        assert_eq!(request.body, b"[1,2]");
        assert!(!format!("{:?}", api()).contains("s3cret"));
    }

    #[test]
    fn statuses_are_classified_and_bodies_decoded() {
        let request = api().request(Method::Get, "/v1/machines/m-1");
        let ok = JsonApi::check(&request, response(200, r#"{"id":"m-1"}"#)).unwrap();
        assert_eq!(
            decode::<Machine>(&request, &ok).unwrap(),
            Machine { id: "m-1".into() }
        );
        match JsonApi::check(&request, response(429, "slow down")) {
            Err(ProviderError::RateLimited(r)) => {
                assert_eq!(r.retry_after_ms, 2000);
                assert_eq!(r.message, "GET /api/v1/machines/m-1: HTTP 429: slow down");
            }
            other => panic!("expected rate-limited, got {other:?}"),
        }
        assert!(matches!(
            JsonApi::check(&request, response(401, "")),
            Err(ProviderError::Unauthorized(_))
        ));
        assert!(matches!(
            decode::<Machine>(&request, &response(200, "<html>")),
            Err(ProviderError::Transient(m)) if m.contains("not the expected JSON")
        ));
    }
}
