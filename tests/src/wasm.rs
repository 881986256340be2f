//! The guest components `tests/build.rs` built from `providers/` and `tests/fixtures/guests/`,
//! found by file stem (`vmop_provider_ec2`, ...).

use std::fmt;
use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/wasm_paths.rs"));

/// A guest name the build did not produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGuest {
    pub name: String,
    pub known: Vec<&'static str>,
}

impl fmt::Display for UnknownGuest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no guest component named `{}` was built (known: {}); guests come from \
             providers/ and tests/fixtures/guests/, named by crate with `_` for `-`",
            self.name,
            if self.known.is_empty() {
                "none".to_owned()
            } else {
                self.known.join(", ")
            }
        )
    }
}

impl std::error::Error for UnknownGuest {}

/// The absolute path of the built component `name` (a crate name with `_`, e.g.
/// `vmop_provider_ec2`).
pub fn path(name: &str) -> Result<&'static Path, UnknownGuest> {
    WASM_PATHS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| Path::new(*p))
        .ok_or_else(|| UnknownGuest {
            name: name.to_owned(),
            known: names().collect(),
        })
}

/// Every built component's name.
pub fn names() -> impl Iterator<Item = &'static str> {
    WASM_PATHS.iter().map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_ec2_provider_and_explains_unknown_names() {
        let ec2 = path("vmop_provider_ec2").unwrap();
        assert!(ec2.is_absolute() && ec2.is_file(), "{}", ec2.display());
        let err = path("no_such_guest").unwrap_err();
        assert!(err.to_string().contains("vmop_provider_ec2"), "{err}");
    }
}
