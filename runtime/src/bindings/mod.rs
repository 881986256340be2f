//! The one place that generates bindings for the contract, once per version the host loads:
//! [`v03`] for `wit/provider.wit` (0.3) and [`v02`] for the frozen `wit/compat/0.2/provider.wit`.
//!
//! Nothing outside this module sees a generated type: [`Pre`] and [`Provider`] take and give
//! the host-side types of [`crate::types`], whichever version the plugin was built for, so the
//! exports, the sandbox and everything above them know one contract. A 0.2 plugin answers every
//! export but `list`; the host asks for `list` only where `info()` lists its capability, and a
//! 0.2 plugin cannot list it (its `info()` is checked against the version it exports).

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use crate::state::State;
use crate::types::{
    Page, PluginInfo, ProviderError, ProviderSettings, UpdateOutcome, VmSpec, VmStatus,
};

#[macro_use]
mod convert;
pub(crate) mod v02;
pub(crate) mod v03;

/// The WIT package version this host was built against (`package vmop:provider@X.Y.Z`).
pub const WIT_VERSION: &str = "0.3.0";

/// A contract version the host loads, by the major.minor a plugin exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    V0_2,
    V0_3,
}

impl Contract {
    /// The contract of a version string (`0.3.0`, `0.2.1`, ...), if the host loads it.
    pub fn of(version: &str) -> Option<Contract> {
        let mut parts = version.trim().split('.');
        let major = parts.next()?.parse::<u64>().ok()?;
        let minor = parts.next()?.parse::<u64>().ok()?;
        match (major, minor) {
            (0, 2) => Some(Contract::V0_2),
            (0, 3) => Some(Contract::V0_3),
            _ => None,
        }
    }
}

/// Both versions' `log` and `types` imports.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    v03::Plugin::add_to_linker::<State, HasSelf<State>>(linker, |s| s)?;
    v02::Plugin::add_to_linker::<State, HasSelf<State>>(linker, |s| s)
}

/// A component linked against the host, for the contract it exports.
pub(crate) enum Pre {
    V0_2(v02::PluginPre<State>),
    V0_3(v03::PluginPre<State>),
}

impl Pre {
    pub fn new(contract: Contract, pre: InstancePre<State>) -> wasmtime::Result<Pre> {
        Ok(match contract {
            Contract::V0_2 => Pre::V0_2(v02::PluginPre::new(pre)?),
            Contract::V0_3 => Pre::V0_3(v03::PluginPre::new(pre)?),
        })
    }

    pub fn contract(&self) -> Contract {
        match self {
            Pre::V0_2(_) => Contract::V0_2,
            Pre::V0_3(_) => Contract::V0_3,
        }
    }

    pub async fn instantiate(&self, store: &mut Store<State>) -> wasmtime::Result<Provider> {
        Ok(match self {
            Pre::V0_2(pre) => Provider::V0_2(pre.instantiate_async(store).await?),
            Pre::V0_3(pre) => Provider::V0_3(pre.instantiate_async(store).await?),
        })
    }
}

/// An instance of a plugin, answering in host-side types.
pub(crate) enum Provider {
    V0_2(v02::Plugin),
    V0_3(v03::Plugin),
}

/// What every export call returns: the guest's fault (trap, limit) or its answer.
pub(crate) type Answered<T> = wasmtime::Result<Result<T, ProviderError>>;

/// Runs `$call` on whichever version `$self` is, with `$config` converted for that version and
/// `$v` naming the version's module (for argument conversions), and converts the answer with
/// `$answer` (default `Into::into`) and the error with `Into::into`. The arms are the same code
/// over different generated types, which is why this is a macro and not a function.
macro_rules! on_each_version {
    ($self:expr, $settings:expr, |$guest:ident, $config:ident, $v:ident| $call:expr) => {
        on_each_version!($self, $settings, |$guest, $config, $v| $call, Into::into)
    };
    ($self:expr, $settings:expr, |$guest:ident, $config:ident, $v:ident| $call:expr, $answer:expr) => {
        match $self {
            Provider::V0_2(world) => {
                #[allow(unused_imports)]
                use v02 as $v;
                let $guest = world.vmop_provider_provider();
                let $config = &v02::ProviderConfig::from($settings);
                Ok($call.await?.map($answer).map_err(Into::into))
            }
            Provider::V0_3(world) => {
                #[allow(unused_imports)]
                use v03 as $v;
                let $guest = world.vmop_provider_provider();
                let $config = &v03::ProviderConfig::from($settings);
                Ok($call.await?.map($answer).map_err(Into::into))
            }
        }
    };
}

impl Provider {
    pub async fn info(&self, store: &mut Store<State>) -> wasmtime::Result<PluginInfo> {
        Ok(match self {
            Provider::V0_2(world) => world
                .vmop_provider_provider()
                .call_info(store)
                .await?
                .into(),
            Provider::V0_3(world) => world
                .vmop_provider_provider()
                .call_info(store)
                .await?
                .into(),
        })
    }

    pub async fn location(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
    ) -> Answered<String> {
        on_each_version!(self, s, |g, config, v| g.call_location(store, config))
    }

    pub async fn find(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        uid: &str,
    ) -> Answered<Option<VmStatus>> {
        on_each_version!(
            self,
            s,
            |g, config, v| g.call_find(store, config, uid),
            |found| found.map(Into::into)
        )
    }

    pub async fn create(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        spec: &VmSpec,
    ) -> Answered<VmStatus> {
        on_each_version!(self, s, |g, config, v| g.call_create(
            store,
            config,
            &v::VmSpec::from(spec)
        ))
    }

    pub async fn get(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        id: &str,
    ) -> Answered<Option<VmStatus>> {
        on_each_version!(
            self,
            s,
            |g, config, v| g.call_get(store, config, id),
            |found| found.map(Into::into)
        )
    }

    pub async fn update(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        id: &str,
        spec: &VmSpec,
    ) -> Answered<UpdateOutcome> {
        on_each_version!(self, s, |g, config, v| g.call_update(
            store,
            config,
            id,
            &v::VmSpec::from(spec)
        ))
    }

    pub async fn start(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        id: &str,
    ) -> Answered<()> {
        on_each_version!(self, s, |g, config, v| g.call_start(store, config, id))
    }

    pub async fn stop(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        id: &str,
    ) -> Answered<()> {
        on_each_version!(self, s, |g, config, v| g.call_stop(store, config, id))
    }

    pub async fn delete(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        id: &str,
    ) -> Answered<()> {
        on_each_version!(self, s, |g, config, v| g.call_delete(store, config, id))
    }

    /// `list` (0.3 only): a 0.2 plugin has no such export, and asking it is the host's bug,
    /// answered as a permanent error rather than a trap.
    pub async fn list(
        &self,
        store: &mut Store<State>,
        s: &ProviderSettings,
        cursor: Option<&str>,
    ) -> Answered<Page> {
        match self {
            Provider::V0_2(_) => Ok(Err(ProviderError::Permanent(
                "the plugin implements contract 0.2, which has no `list`".to_owned(),
            ))),
            Provider::V0_3(world) => {
                let config = &v03::ProviderConfig::from(s);
                let r = world
                    .vmop_provider_provider()
                    .call_list(store, config, cursor)
                    .await?;
                Ok(r.map(Into::into).map_err(Into::into))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wit_version_matches_the_package() {
        let wit = include_str!("../../../wit/provider.wit");
        let expected = format!("package vmop:provider@{};", WIT_VERSION);
        assert!(
            wit.contains(&expected),
            "wit/provider.wit does not declare {expected}"
        );
        let frozen = include_str!("../../../wit/compat/0.2/provider.wit");
        assert!(frozen.contains("package vmop:provider@0.2.0;"));
    }

    #[test]
    fn contracts_are_read_by_major_and_minor() {
        assert_eq!(Contract::of("0.3.0"), Some(Contract::V0_3));
        assert_eq!(Contract::of(" 0.3.7 "), Some(Contract::V0_3));
        assert_eq!(Contract::of("0.2.0"), Some(Contract::V0_2));
        assert_eq!(Contract::of("0.1.0"), None);
        assert_eq!(Contract::of("1.3.0"), None);
        assert_eq!(Contract::of("0.9.0"), None);
        assert_eq!(Contract::of("x"), None);
    }
}
