//! The error-class checks: a refused credential is `unauthorized`, an impossible spec
//! `invalid-spec`.

use super::calls::describe;
use super::suite::Suite;
use vmop_runtime::Plugin;
use vmop_runtime::sandbox::CallError;
use vmop_runtime::types::{ErrorClass, ProviderError};

use super::is_unauthorized;

impl Suite<'_> {
    pub(super) async fn refused_credential(&mut self, plugin: &Plugin) {
        let secrets = &self.ctx().settings.secrets;
        if secrets.is_empty() {
            return self.skip(
                "refused-credential",
                "no secrets given (--secrets-file): there is no credential to falsify",
            );
        }
        let mut ctx = self.ctx().clone();
        for value in ctx.settings.secrets.values_mut() {
            *value = format!("vmop-conformance-bogus-{}", value.len());
        }
        let mark = self.calls.all.len();
        let result = self.calls.run("find", plugin.find(&ctx, &self.uid)).await;
        let verdict = match result {
            Err(e) if is_unauthorized(&e) => Ok(describe(&e)),
            Ok(_) => {
                return self.skip(
                    "refused-credential",
                    "the backend accepted falsified secrets (it checks no credentials), so \
                     the `unauthorized` class cannot be shown against it",
                );
            }
            Err(e) => Err(format!(
                "falsified secrets answered {}, not unauthorized: {}",
                class_name(&e),
                describe(&e)
            )),
        };
        self.record("refused-credential", mark, verdict);
    }

    pub(super) async fn impossible_spec(&mut self, plugin: &Plugin) {
        let mark = self.calls.all.len();
        let uid = format!("{}-impossible", self.uid);
        self.uids.push(uid.clone());
        let spec = self.spec(&uid, &self.options.impossible_image);
        let result = self
            .calls
            .run("create", plugin.create(self.ctx(), &spec))
            .await;
        let image = &self.options.impossible_image;
        let verdict = match result {
            Err(CallError::Provider(e @ ProviderError::InvalidSpec(_))) => Ok(e.to_string()),
            Ok(s) => {
                self.created.insert(s.id.clone());
                Err(format!("create with image `{image}` made machine {}", s.id))
            }
            Err(e) => Err(format!(
                "create with image `{image}` answered {}, not invalid-spec: {}",
                class_name(&e),
                describe(&e)
            )),
        };
        self.record("impossible-spec", mark, verdict);
    }
}

/// The error class as the contract spells it (a plugin fault has none: it says what it was).
fn class_name(e: &CallError) -> &'static str {
    match e {
        CallError::Provider(p) => match ErrorClass::from(p) {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimited(_) => "rate-limited",
            ErrorClass::Permanent => "permanent",
            ErrorClass::InvalidSpec => "invalid-spec",
            ErrorClass::Unauthorized => "unauthorized",
        },
        CallError::Trap { .. } => "a trap",
        CallError::Timeout { .. } => "a timeout",
        CallError::MemoryLimit { .. } => "the memory cap",
        CallError::ContractViolation { .. } => "a contract violation",
        CallError::Instantiate { .. } => "a host failure to instantiate",
    }
}
