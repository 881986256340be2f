//! The generated export trait implemented for any [`Provider`]: conversion of the WIT's owned
//! arguments, and [`bounds`] applied to every answer on its way out.

use std::marker::PhantomData;

use crate::bindings::exports::vmop::provider::provider::Guest;
use crate::{
    Config, PluginInfo, Provider, ProviderConfig, ProviderError, UpdateOutcome, VmSpec, VmStatus,
    bounds,
};

/// Connects a [`Provider`] to the generated export trait, bounding every answer on the way
/// out ([`bounds`]). Used through [`export_provider!`].
#[doc(hidden)]
#[derive(Debug)]
pub struct Adapter<P>(PhantomData<P>);

impl<P: Provider> Guest for Adapter<P> {
    fn info() -> PluginInfo {
        bounds::info(P::info())
    }

    fn location(config: ProviderConfig) -> Result<String, ProviderError> {
        bounds::result(P::location(&Config::from(config)), bounds::location)
    }

    fn find(config: ProviderConfig, uid: String) -> Result<Option<VmStatus>, ProviderError> {
        bounds::result(
            P::find(&Config::from(config), &uid),
            bounds::optional_status,
        )
    }

    fn create(config: ProviderConfig, spec: VmSpec) -> Result<VmStatus, ProviderError> {
        bounds::result(P::create(&Config::from(config), spec), bounds::status)
    }

    fn get(config: ProviderConfig, id: String) -> Result<Option<VmStatus>, ProviderError> {
        bounds::result(P::get(&Config::from(config), &id), bounds::optional_status)
    }

    fn update(
        config: ProviderConfig,
        id: String,
        spec: VmSpec,
    ) -> Result<UpdateOutcome, ProviderError> {
        P::update(&Config::from(config), &id, spec).map_err(bounds::error)
    }

    fn start(config: ProviderConfig, id: String) -> Result<(), ProviderError> {
        P::start(&Config::from(config), &id).map_err(bounds::error)
    }

    fn stop(config: ProviderConfig, id: String) -> Result<(), ProviderError> {
        P::stop(&Config::from(config), &id).map_err(bounds::error)
    }

    fn delete(config: ProviderConfig, id: String) -> Result<(), ProviderError> {
        P::delete(&Config::from(config), &id).map_err(bounds::error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Phase, WIT_VERSION, error};

    /// Breaks every bound it can, to show the adapter repairs or refuses each answer.
    struct Careless;

    fn config() -> ProviderConfig {
        ProviderConfig {
            settings: Vec::new(),
            secrets: Vec::new(),
        }
    }

    impl Provider for Careless {
        fn info() -> PluginInfo {
            PluginInfo {
                name: "careless".into(),
                version: "0.0.0".into(),
                wit_version: WIT_VERSION.into(),
                capabilities: Vec::new(),
                parameters: Vec::new(),
            }
        }
        fn location(_: &Config) -> Result<String, ProviderError> {
            Ok("l".repeat(1 << 20))
        }
        fn find(_: &Config, uid: &str) -> Result<Option<VmStatus>, ProviderError> {
            Ok(Some(VmStatus {
                id: uid.into(),
                phase: Phase::Running,
                addresses: vec!["10.0.0.1".into(); 10_000],
                message: Some("m".repeat(2 << 20)),
                owner: Some(uid.into()),
            }))
        }
        fn create(_: &Config, spec: VmSpec) -> Result<VmStatus, ProviderError> {
            Err(error::rate_limited(
                std::time::Duration::MAX,
                spec.name.repeat(1 << 20),
            ))
        }
        fn get(_: &Config, id: &str) -> Result<Option<VmStatus>, ProviderError> {
            Self::find(&Config::default(), &id.repeat(1 << 20))
        }
        fn delete(_: &Config, _: &str) -> Result<(), ProviderError> {
            Err(ProviderError::Unauthorized("d".repeat(5000)))
        }
    }

    type Exported = Adapter<Careless>;

    #[test]
    fn every_answer_leaves_within_the_bounds() {
        assert!(matches!(
            Exported::location(config()),
            Err(ProviderError::Permanent(_))
        ));
        let found = Exported::find(config(), "i-1".into()).ok().flatten();
        let found = found.unwrap_or_else(|| panic!("find lost its answer"));
        assert_eq!(found.addresses.len(), bounds::MAX_ADDRESSES);
        assert!(
            found
                .message
                .is_some_and(|m| m.len() <= bounds::MAX_MESSAGE)
        );
        assert!(matches!(
            Exported::get(config(), "i".into()),
            Err(ProviderError::Permanent(_))
        ));
        let spec = VmSpec {
            name: "n".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            image: "img".into(),
            cpu: 1,
            memory_mib: 512,
            user_data: None,
            labels: Vec::new(),
            parameters: Vec::new(),
        };
        match Exported::create(config(), spec.clone()) {
            Err(ProviderError::RateLimited(r)) => {
                assert_eq!(r.retry_after_ms, bounds::MAX_RETRY_AFTER_MS);
                assert!(r.message.len() <= bounds::MAX_MESSAGE);
            }
            other => panic!("expected rate-limited, got {other:?}"),
        }
        assert!(matches!(
            Exported::delete(config(), "i".into()),
            Err(ProviderError::Unauthorized(m)) if m.len() <= bounds::MAX_MESSAGE
        ));
        assert!(matches!(
            Exported::update(config(), "i".into(), spec),
            Err(ProviderError::Permanent(m)) if m == "update is not supported by this provider"
        ));
        assert!(Exported::start(config(), "i".into()).is_err());
        assert!(matches!(
            Exported::stop(config(), "i".into()),
            Err(ProviderError::Permanent(m)) if m.starts_with("stop ")
        ));
    }
}
