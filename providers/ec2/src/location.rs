//! `location`: `aws:<account-id>:<region>:<endpoint>`, the account from STS
//! `GetCallerIdentity`.
//!
//! All three parts decide which machines a config can see: another account or region is
//! another set of instances, and so is another endpoint with the same account id (moto and
//! real EC2 both answer for `123456789012`). The string depends only on those, so it is stable
//! for as long as the ProviderConfig points at the same place.

use vmop_provider_sdk::bounds::MAX_LOCATION;
use vmop_provider_sdk::error::{permanent, transient};
use vmop_provider_sdk::url::Url;
use vmop_provider_sdk::{Config, ProviderError};

use crate::query::{self, Api, CallError, Params};
use crate::xml;

pub fn location(config: &Config) -> Result<String, ProviderError> {
    let region = config.settings.require("region")?;
    let endpoint = query::ec2_endpoint(config)?;
    let sts = Api::sts(config)?;
    let body = sts.call("GetCallerIdentity", &Params::new())?;
    let account = xml::caller_account(&body)
        .map_err(CallError::xml("GetCallerIdentity"))?
        .ok_or_else(|| transient("GetCallerIdentity answered without an account"))?;
    format(&account, region, &endpoint)
}

/// The location string; the endpoint without a bare `/` path, so `http://h:1` and `http://h:1/`
/// are one location.
pub fn format(account: &str, region: &str, endpoint: &Url) -> Result<String, ProviderError> {
    if account.is_empty() || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(transient(format!(
            "GetCallerIdentity answered account `{account}`, which is not an AWS account id"
        )));
    }
    let path = match endpoint.path_and_query() {
        "/" => "",
        path => path,
    };
    let location = format!(
        "aws:{account}:{region}:{}://{}{path}",
        endpoint.scheme().as_str(),
        endpoint.authority()
    );
    if location.len() > MAX_LOCATION {
        return Err(permanent(format!(
            "the location of this ProviderConfig (account, region and endpoint) is {} bytes, \
             more than the {MAX_LOCATION} the contract allows: shorten `endpoint` or `region`",
            location.len()
        )));
    }
    Ok(location)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> Url {
        Url::parse(u).unwrap()
    }

    #[test]
    fn names_account_region_and_endpoint() {
        assert_eq!(
            format(
                "123456789012",
                "us-east-1",
                &url("https://ec2.us-east-1.amazonaws.com")
            )
            .ok()
            .as_deref(),
            Some("aws:123456789012:us-east-1:https://ec2.us-east-1.amazonaws.com")
        );
        let moto = format("123456789012", "us-east-1", &url("http://127.0.0.1:5000/")).ok();
        assert_eq!(
            moto.as_deref(),
            Some("aws:123456789012:us-east-1:http://127.0.0.1:5000")
        );
        let proxied = format("1", "r", &url("https://proxy.example/ec2")).ok();
        assert_eq!(
            proxied.as_deref(),
            Some("aws:1:r:https://proxy.example/ec2")
        );
    }

    #[test]
    fn is_stable_across_spellings_of_one_endpoint() {
        let a = format("1", "r", &url("https://EC2.example.com:443/"));
        let b = format("1", "r", &url("https://ec2.example.com"));
        assert_eq!(a.ok(), b.ok());
    }

    #[test]
    fn refuses_odd_accounts_and_long_locations() {
        let endpoint = url("http://h");
        assert!(matches!(
            format("", "r", &endpoint),
            Err(ProviderError::Transient(_))
        ));
        assert!(matches!(
            format("12a", "r", &endpoint),
            Err(ProviderError::Transient(_))
        ));
        let long = url(&format!("http://h/{}", "p".repeat(600)));
        assert!(matches!(
            format("1", "r", &long),
            Err(ProviderError::Permanent(m)) if m.contains("512")
        ));
    }
}
