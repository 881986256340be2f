//! The generated export trait implemented for any [`Provider`]: conversion of the WIT's owned
//! arguments, and [`bounds`] applied to every answer on its way out. A `contract-0-2` build
//! exports no `list` and drops the capability `list` from `info()`.

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
        #[cfg_attr(not(feature = "contract-0-2"), allow(unused_mut))]
        let mut info = P::info();
        #[cfg(feature = "contract-0-2")]
        info.capabilities.retain(|c| c != crate::CAPABILITY_LIST);
        bounds::info(info)
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

    #[cfg(not(feature = "contract-0-2"))]
    fn list(config: ProviderConfig, cursor: Option<String>) -> Result<crate::Page, ProviderError> {
        let mut left_out = Vec::new();
        let page = bounds::result(P::list(&Config::from(config), cursor), |page| {
            bounds::page(page, &mut left_out)
        });
        for reason in left_out {
            crate::log::warn(&format!("left out of the listing: {reason}"));
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(not(feature = "contract-0-2"))]
    use crate::{ListedMachine, Page};
    use crate::{Phase, WIT_VERSION, error};

    /// Breaks every bound it can, to show the adapter repairs or refuses each answer.
    struct Careless;

    fn config() -> ProviderConfig {
        ProviderConfig {
            settings: Vec::new(),
            secrets: Vec::new(),
            #[cfg(not(feature = "contract-0-2"))]
            cluster: "c-1".into(),
        }
    }

    impl Provider for Careless {
        fn info() -> PluginInfo {
            PluginInfo {
                name: "careless".into(),
                version: "0.0.0".into(),
                wit_version: WIT_VERSION.into(),
                capabilities: vec!["power".into(), crate::CAPABILITY_LIST.into()],
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

    #[cfg(not(feature = "contract-0-2"))]
    #[test]
    fn list_defaults_to_unsupported_and_is_bounded() {
        assert!(matches!(
            Exported::list(config(), None),
            Err(ProviderError::Permanent(m)) if m == "list is not supported by this provider"
        ));
        assert_eq!(Exported::info().capabilities, ["power", "list"]);

        struct Lister;
        impl Provider for Lister {
            fn info() -> PluginInfo {
                Careless::info()
            }
            fn location(_: &Config) -> Result<String, ProviderError> {
                Ok("l".into())
            }
            fn find(_: &Config, _: &str) -> Result<Option<VmStatus>, ProviderError> {
                Ok(None)
            }
            fn create(_: &Config, _: VmSpec) -> Result<VmStatus, ProviderError> {
                Err(ProviderError::Permanent("no".into()))
            }
            fn get(_: &Config, _: &str) -> Result<Option<VmStatus>, ProviderError> {
                Ok(None)
            }
            fn delete(_: &Config, _: &str) -> Result<(), ProviderError> {
                Ok(())
            }
            /// As many machines as the cursor says, each named by the config's cluster.
            fn list(config: &Config, cursor: Option<String>) -> Result<Page, ProviderError> {
                let count: usize = cursor.as_deref().unwrap_or("0").parse().unwrap_or(0);
                let machines = (0..count)
                    .map(|i| ListedMachine {
                        status: VmStatus {
                            id: format!("i-{i}"),
                            phase: Phase::Running,
                            addresses: Vec::new(),
                            message: None,
                            owner: None,
                        },
                        cluster: Some(config.cluster.clone()),
                        created_at_ms: None,
                    })
                    .collect();
                Ok(Page {
                    machines,
                    next: Some("x".repeat(count)),
                })
            }
        }
        type Listed = Adapter<Lister>;
        let page = Listed::list(config(), Some("2".into())).ok();
        let page = page.unwrap_or_else(|| panic!("a page of two was refused"));
        assert_eq!(page.machines.len(), 2);
        assert_eq!(
            page.machines.first().and_then(|m| m.cluster.as_deref()),
            Some("c-1")
        );
        assert_eq!(page.next.as_deref(), Some("xx"));
        assert!(matches!(
            Listed::list(config(), Some("1001".into())),
            Err(ProviderError::Permanent(m)) if m.contains("1001 machines")
        ));
    }

    #[cfg(feature = "contract-0-2")]
    #[test]
    fn a_0_2_build_declares_no_list() {
        assert_eq!(Exported::info().capabilities, ["power"]);
        assert_eq!(Exported::info().wit_version, "0.2.0");
    }
}
