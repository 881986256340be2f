//! The AWS Query API as EC2 and STS speak it: form-encoded POSTs signed with SigV4 (by the
//! host, or under `credentials: passthrough` by the SDK's `sigv4`), answered with XML.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vmop_provider_sdk::error::transient;
use vmop_provider_sdk::http::{
    Client, HttpError, Method, Request, SIGNING_REGION_HINT, SIGNING_SERVICE_HINT, error_chain,
};
use vmop_provider_sdk::sigv4::{self, Credentials, Scope, Unsigned};
use vmop_provider_sdk::url::{Url, UrlError, encode_component};
use vmop_provider_sdk::{Config, ProviderError, status};

use crate::errors::error_for_code;
use crate::xml;

/// One Query API: its SigV4 service name and the `Version` sent with every action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    pub name: &'static str,
    pub version: &'static str,
}

pub const EC2: Service = Service {
    name: "ec2",
    version: "2016-11-15",
};

/// Only for `GetCallerIdentity`, the account behind the credentials (see `location.rs`).
pub const STS: Service = Service {
    name: "sts",
    version: "2011-06-15",
};

const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// The parameters of one action, in order (`Filter.1.Name`, `Filter.1.Value.1`, ...).
#[derive(Debug, Clone, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, name: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.0.push((name.into(), value.into()));
        self
    }

    /// `Filter.N.Name=name` and `Filter.N.Value.M=value` for each value.
    pub fn filter(&mut self, n: usize, name: &str, values: &[&str]) -> &mut Self {
        self.push(format!("Filter.{n}.Name"), name);
        for (m, value) in values.iter().enumerate() {
            self.push(format!("Filter.{n}.Value.{}", m + 1), *value);
        }
        self
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &(String, String)> {
        self.0.iter()
    }

    fn form(&self, action: &str, version: &str) -> String {
        [("Action", action), ("Version", version)]
            .into_iter()
            .chain(self.0.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            .map(|(n, v)| format!("{}={}", encode_component(n), encode_component(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// A failed action: the cloud's error code when it sent one, so callers can treat some codes
/// (`InvalidInstanceID.NotFound`) as answers rather than failures.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{action} failed with HTTP {status}: {code}: {message}")]
    Api {
        action: &'static str,
        status: u16,
        code: String,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("{action} failed with HTTP {status} and no AWS error code: {body}")]
    Status {
        action: &'static str,
        status: u16,
        retry_after: Option<String>,
        body: String,
    },
    #[error("{action} could not reach the endpoint")]
    Http {
        action: &'static str,
        #[source]
        source: HttpError,
    },
    #[error("{action} returned a response that is not the expected XML")]
    Xml {
        action: &'static str,
        #[source]
        source: xml::XmlError,
    },
}

impl CallError {
    pub fn code(&self) -> Option<&str> {
        match self {
            CallError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    pub fn xml(action: &'static str) -> impl FnOnce(xml::XmlError) -> CallError {
        move |source| CallError::Xml { action, source }
    }
}

impl From<CallError> for ProviderError {
    fn from(err: CallError) -> Self {
        let message = error_chain(&err);
        match err {
            CallError::Api {
                status,
                code,
                retry_after,
                ..
            } => error_for_code(&code, status, retry_after, message),
            CallError::Status {
                status,
                retry_after,
                ..
            } => status::error_for_status(status, retry_after.as_deref(), message.clone())
                .unwrap_or_else(|| transient(message)),
            CallError::Http { source, .. } => {
                let class = ProviderError::from(source);
                match class {
                    ProviderError::Permanent(_) => ProviderError::Permanent(message),
                    _ => ProviderError::Transient(message),
                }
            }
            CallError::Xml { .. } => ProviderError::Transient(message),
        }
    }
}

/// One configured Query API endpoint with its credentials.
#[derive(Debug)]
pub struct Api {
    service: Service,
    endpoint: Url,
    region: String,
    /// `None` when the ProviderConfig has the host sign (`credentials: aws-sigv4`, the default):
    /// then `config.secrets` is empty and the request goes out unsigned, with the service and
    /// region as hints the host signs for.
    credentials: Option<Credentials>,
    http: Client,
}

impl Api {
    /// EC2 at [`ec2_endpoint`]; secrets `access_key_id`, `secret_access_key` (required) and
    /// `session_token` (optional).
    pub fn ec2(config: &Config) -> Result<Api, ProviderError> {
        Api::new(EC2, ec2_endpoint(config)?, config)
    }

    /// STS at [`sts_endpoint`], with the same credentials as EC2.
    pub fn sts(config: &Config) -> Result<Api, ProviderError> {
        Api::new(STS, sts_endpoint(config)?, config)
    }

    fn new(service: Service, endpoint: Url, config: &Config) -> Result<Api, ProviderError> {
        Ok(Api {
            service,
            endpoint,
            region: config.settings.require("region")?.to_owned(),
            // Host signing hands the plugin no secret; passthrough hands it the keys.
            credentials: Credentials::from_secrets(&config.secrets)?,
            http: Client::new(),
        })
    }

    /// Runs `action` and returns the XML body of a successful answer.
    pub fn call(&self, action: &'static str, params: &Params) -> Result<String, CallError> {
        let body = params.form(action, self.service.version);
        let headers = vec![("content-type".to_owned(), CONTENT_TYPE.to_owned())];
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let scope = Scope {
            region: &self.region,
            service: self.service.name,
            time,
        };
        let unsigned = Unsigned {
            method: "POST",
            url: &self.endpoint,
            headers: &headers,
            payload: body.as_bytes(),
        };
        let auth = match &self.credentials {
            Some(credentials) => sigv4::sign(credentials, scope, unsigned),
            // The host signs (and removes these hints before sending).
            None => vec![
                (
                    SIGNING_SERVICE_HINT.to_owned(),
                    self.service.name.to_owned(),
                ),
                (SIGNING_REGION_HINT.to_owned(), self.region.clone()),
            ],
        };
        let mut request = Request::new(Method::Post, self.endpoint.clone()).body(body);
        request.headers = headers.into_iter().chain(auth).collect();

        let response = self
            .http
            .send(&request)
            .map_err(|source| CallError::Http { action, source })?;
        let text = response.text();
        if (200..300).contains(&response.status) {
            return Ok(text);
        }
        let retry_after = response.header("retry-after");
        match xml::error(&text) {
            Some((code, message)) => Err(CallError::Api {
                action,
                status: response.status,
                code,
                message,
                retry_after: retry_after.and_then(status::parse_retry_after),
            }),
            None => Err(CallError::Status {
                action,
                status: response.status,
                retry_after: retry_after.map(str::to_owned),
                body: text.chars().take(200).collect(),
            }),
        }
    }
}

/// Setting `endpoint`, default `https://ec2.<region>.amazonaws.com`.
pub fn ec2_endpoint(config: &Config) -> Result<Url, ProviderError> {
    let region = config.settings.require("region")?;
    match config.settings.get("endpoint") {
        Some(endpoint) => parse_endpoint("endpoint", endpoint),
        None => parse_endpoint("region", &format!("https://ec2.{region}.amazonaws.com")),
    }
}

/// Setting `stsEndpoint`; else setting `endpoint`, since an EC2 stand-in (moto, LocalStack)
/// serves STS on the same port; else `https://sts.<region>.amazonaws.com`.
pub fn sts_endpoint(config: &Config) -> Result<Url, ProviderError> {
    let region = config.settings.require("region")?;
    match (
        config.settings.get("stsEndpoint"),
        config.settings.get("endpoint"),
    ) {
        (Some(sts), _) => parse_endpoint("stsEndpoint", sts),
        (None, Some(endpoint)) => parse_endpoint("endpoint", endpoint),
        (None, None) => parse_endpoint("region", &format!("https://sts.{region}.amazonaws.com")),
    }
}

fn parse_endpoint(setting: &str, url: &str) -> Result<Url, ProviderError> {
    Url::parse(url)
        .map_err(|e: UrlError| ProviderError::Permanent(format!("setting `{setting}`: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encodes_action_version_and_params_in_order() {
        let mut params = Params::new();
        params
            .push("ImageId", "ami-1")
            .filter(1, "tag:vmop.dev/uid", &["a b", "c"]);
        assert_eq!(
            params.form("DescribeInstances", EC2.version),
            "Action=DescribeInstances&Version=2016-11-15&ImageId=ami-1\
             &Filter.1.Name=tag%3Avmop.dev%2Fuid&Filter.1.Value.1=a%20b&Filter.1.Value.2=c"
        );
    }

    #[test]
    fn api_errors_keep_their_code_and_map_by_it() {
        let err = CallError::Api {
            action: "DescribeImages",
            status: 400,
            code: "InvalidAMIID.NotFound".into(),
            message: "The image id '[ami-x]' does not exist".into(),
            retry_after: None,
        };
        assert_eq!(err.code(), Some("InvalidAMIID.NotFound"));
        match ProviderError::from(err) {
            ProviderError::InvalidSpec(m) => {
                assert!(
                    m.starts_with("DescribeImages failed with HTTP 400: InvalidAMIID"),
                    "{m}"
                );
            }
            other => panic!("expected invalid-spec, got {other:?}"),
        }
    }

    #[test]
    fn unavailable_without_a_code_still_waits_as_told() {
        let err = CallError::Status {
            action: "RunInstances",
            status: 503,
            retry_after: Some("20".into()),
            body: "<html>busy</html>".into(),
        };
        assert!(matches!(
            ProviderError::from(err),
            ProviderError::RateLimited(r) if r.retry_after_ms == 20_000
        ));
    }

    #[test]
    fn missing_credentials_name_the_key() {
        let config = Config {
            settings: [("region", "us-east-1")].into_iter().collect(),
            secrets: [("access_key_id", "AKID")].into_iter().collect(),
            ..Config::default()
        };
        match Api::ec2(&config) {
            Err(ProviderError::Permanent(m)) => assert!(m.contains("secret_access_key"), "{m}"),
            other => panic!("expected a permanent error, got {other:?}"),
        }
    }

    fn config(settings: &[(&str, &str)]) -> Config {
        Config {
            settings: settings.iter().copied().collect(),
            secrets: [("access_key_id", "AKID"), ("secret_access_key", "s")]
                .into_iter()
                .collect(),
            ..Config::default()
        }
    }

    #[test]
    fn endpoint_defaults_to_the_region() {
        let ec2 = Api::ec2(&config(&[("region", "eu-west-1")])).unwrap();
        assert_eq!(
            ec2.endpoint.to_string(),
            "https://ec2.eu-west-1.amazonaws.com/"
        );
        assert_eq!(ec2.service, EC2);
    }

    #[test]
    fn sts_follows_the_ec2_endpoint_unless_set() {
        let sts =
            |settings: &[(&str, &str)]| sts_endpoint(&config(settings)).map(|u| u.to_string());
        assert_eq!(
            sts(&[("region", "eu-west-1")]).ok().as_deref(),
            Some("https://sts.eu-west-1.amazonaws.com/")
        );
        assert_eq!(
            sts(&[
                ("region", "us-east-1"),
                ("endpoint", "http://127.0.0.1:5000")
            ])
            .ok()
            .as_deref(),
            Some("http://127.0.0.1:5000/")
        );
        let both = [
            ("region", "us-east-1"),
            ("endpoint", "http://127.0.0.1:5000"),
            ("stsEndpoint", "http://127.0.0.1:5001"),
        ];
        assert_eq!(sts(&both).ok().as_deref(), Some("http://127.0.0.1:5001/"));
        let bad = sts(&[("region", "r"), ("stsEndpoint", "sts.local")]);
        assert!(matches!(bad, Err(ProviderError::Permanent(m)) if m.contains("`stsEndpoint`")));
        let api = Api::sts(&config(&[("region", "r")])).unwrap();
        assert_eq!(api.service, STS);
    }
}
