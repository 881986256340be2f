//! The exports of `vmop:provider/provider`, each as one type: its arguments, its answer and how
//! it is invoked; how an answer is checked against the contract's bounds and redacted is its
//! [`Answer`] type's, the same whichever export gives it.
//!
//! [`Plugin::call`](crate::Plugin::call) runs any of them through the one sandboxed call path
//! ([`crate::sandbox`]), so the host knows an export in one place: adding one is the WIT, its
//! conversions in `bindings`, and one type here. What the sandbox does around every export
//! (limits, bounds of errors, redaction of errors, logging) is written once, in the sandbox.

use std::future::Future;

use wasmtime::Store;

use crate::bindings::Provider;
use crate::bounds::{self, Violation};
use crate::redact::Redactor;
use crate::state::State;
use crate::types::{
    Operation, Page, PluginInfo, ProviderError, ProviderSettings, UpdateOutcome, VmSpec, VmStatus,
};

/// An instance of the plugin, ready for one export call. Only the sandbox makes one.
pub struct Guest<'a> {
    guest: &'a Provider,
    store: &'a mut Store<State>,
    config: &'a ProviderSettings,
}

impl<'a> Guest<'a> {
    pub(crate) fn new(
        guest: &'a Provider,
        store: &'a mut Store<State>,
        config: &'a ProviderSettings,
    ) -> Self {
        Guest {
            guest,
            store,
            config,
        }
    }
}

impl std::fmt::Debug for Guest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest").finish_non_exhaustive()
    }
}

mod sealed {
    /// Only the contract's own exports can be called.
    pub trait Sealed {}
}

/// One export of the contract, called through [`Plugin::call`](crate::Plugin::call).
pub trait Export: Send + sealed::Sealed {
    /// What the plugin answers when it does not return a `provider-error`.
    type Answer: Answer;
    /// The operation, for limits, metrics and log lines.
    const OP: Operation;

    #[doc(hidden)]
    fn invoke<'a>(
        self,
        guest: Guest<'a>,
    ) -> impl Future<Output = wasmtime::Result<Result<Self::Answer, ProviderError>>> + Send + 'a;
}

/// A successful answer of an export: checked against the contract's bounds and redacted the
/// same way by whichever export gives it (errors are checked and redacted by the sandbox, the
/// same for every export).
pub trait Answer: Send + Sized {
    /// Checks the answer against the contract's bounds.
    #[doc(hidden)]
    fn check(&self) -> Result<(), Violation>;

    /// Replaces every Secret value the host knows in the answer's text.
    #[doc(hidden)]
    fn redact(self, redactor: &Redactor) -> Self;
}

impl Answer for PluginInfo {
    fn check(&self) -> Result<(), Violation> {
        bounds::info(self)
    }

    fn redact(self, _: &Redactor) -> Self {
        self
    }
}

/// A location: identity, never rewritten (see [`crate::redact`]).
impl Answer for String {
    fn check(&self) -> Result<(), Violation> {
        bounds::location(self)
    }

    fn redact(self, _: &Redactor) -> Self {
        self
    }
}

impl Answer for VmStatus {
    fn check(&self) -> Result<(), Violation> {
        bounds::status(self)
    }

    fn redact(self, redactor: &Redactor) -> Self {
        redactor.status(self)
    }
}

impl Answer for Page {
    fn check(&self) -> Result<(), Violation> {
        bounds::page(self)
    }

    fn redact(self, redactor: &Redactor) -> Self {
        Page {
            machines: self
                .machines
                .into_iter()
                .map(|m| crate::types::ListedMachine {
                    status: redactor.status(m.status),
                    ..m
                })
                .collect(),
            next: self.next,
        }
    }
}

impl<T: Answer> Answer for Option<T> {
    fn check(&self) -> Result<(), Violation> {
        self.as_ref().map_or(Ok(()), T::check)
    }

    fn redact(self, redactor: &Redactor) -> Self {
        self.map(|answer| answer.redact(redactor))
    }
}

/// Answers with no text of the plugin's: nothing to bound or redact.
macro_rules! plain_answer {
    ($($t:ty),*) => {$(
        impl Answer for $t {
            fn check(&self) -> Result<(), Violation> {
                Ok(())
            }

            fn redact(self, _: &Redactor) -> Self {
                self
            }
        }
    )*};
}

plain_answer!((), UpdateOutcome);

/// `info()`: who the plugin is and what it supports. Called once when it is loaded.
#[derive(Debug, Clone, Copy)]
pub struct Info;

impl sealed::Sealed for Info {}

impl Export for Info {
    type Answer = PluginInfo;
    const OP: Operation = Operation::Info;

    async fn invoke<'a>(self, g: Guest<'a>) -> wasmtime::Result<Result<PluginInfo, ProviderError>> {
        Ok(Ok(g.guest.info(g.store).await?))
    }
}

/// `location(config)`: where the ProviderConfig's machines live (account, region, endpoint).
#[derive(Debug, Clone, Copy)]
pub struct Location;

impl sealed::Sealed for Location {}

impl Export for Location {
    type Answer = String;
    const OP: Operation = Operation::Location;

    async fn invoke<'a>(self, g: Guest<'a>) -> wasmtime::Result<Result<String, ProviderError>> {
        g.guest.location(g.store, g.config).await
    }
}

/// `find(config, uid)`: the machine tagged with a VM's uid, if any.
#[derive(Debug, Clone)]
pub struct Find {
    pub uid: String,
}

impl sealed::Sealed for Find {}

impl Export for Find {
    type Answer = Option<VmStatus>;
    const OP: Operation = Operation::Find;

    async fn invoke<'a>(
        self,
        g: Guest<'a>,
    ) -> wasmtime::Result<Result<Option<VmStatus>, ProviderError>> {
        g.guest.find(g.store, g.config, &self.uid).await
    }
}

/// `create(config, spec)`: a new machine for a VM.
#[derive(Debug, Clone)]
pub struct Create {
    pub spec: VmSpec,
}

impl sealed::Sealed for Create {}

impl Export for Create {
    type Answer = VmStatus;
    const OP: Operation = Operation::Create;

    async fn invoke<'a>(self, g: Guest<'a>) -> wasmtime::Result<Result<VmStatus, ProviderError>> {
        g.guest.create(g.store, g.config, &self.spec).await
    }
}

/// `get(config, id)`: the machine's status, or `None` when it is gone.
#[derive(Debug, Clone)]
pub struct Get {
    pub id: String,
}

impl sealed::Sealed for Get {}

impl Export for Get {
    type Answer = Option<VmStatus>;
    const OP: Operation = Operation::Get;

    async fn invoke<'a>(
        self,
        g: Guest<'a>,
    ) -> wasmtime::Result<Result<Option<VmStatus>, ProviderError>> {
        g.guest.get(g.store, g.config, &self.id).await
    }
}

/// `update(config, id, spec)`: a day-2 change of a machine's size.
#[derive(Debug, Clone)]
pub struct Update {
    pub id: String,
    pub spec: VmSpec,
}

impl sealed::Sealed for Update {}

impl Export for Update {
    type Answer = UpdateOutcome;
    const OP: Operation = Operation::Update;

    async fn invoke<'a>(
        self,
        g: Guest<'a>,
    ) -> wasmtime::Result<Result<UpdateOutcome, ProviderError>> {
        g.guest
            .update(g.store, g.config, &self.id, &self.spec)
            .await
    }
}

/// `list(config, cursor)`: one page of the config's machines (capability `list`, contract 0.3).
#[derive(Debug, Clone)]
pub struct List {
    /// `None` for the first page, then the previous page's `next`.
    pub cursor: Option<String>,
}

impl sealed::Sealed for List {}

impl Export for List {
    type Answer = Page;
    const OP: Operation = Operation::List;

    async fn invoke<'a>(self, g: Guest<'a>) -> wasmtime::Result<Result<Page, ProviderError>> {
        g.guest
            .list(g.store, g.config, self.cursor.as_deref())
            .await
    }
}

/// The exports that take `(config, id)` and answer nothing but an error.
macro_rules! on_id_export {
    ($(#[$doc:meta])* $name:ident, $op:expr, $call:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            pub id: String,
        }

        impl sealed::Sealed for $name {}

        impl Export for $name {
            type Answer = ();
            const OP: Operation = $op;

            async fn invoke<'a>(self, g: Guest<'a>) -> wasmtime::Result<Result<(), ProviderError>> {
                g.guest.$call(g.store, g.config, &self.id).await
            }

        }
    };
}

on_id_export!(
    /// `start(config, id)`: power a stopped machine on.
    Start,
    Operation::Start,
    start
);
on_id_export!(
    /// `stop(config, id)`: power a machine off, keeping it.
    Stop,
    Operation::Stop,
    stop
);
on_id_export!(
    /// `delete(config, id)`: remove the machine.
    Delete,
    Operation::Delete,
    delete
);
