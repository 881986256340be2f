//! The last `location()` answer of each ProviderConfig, kept while nothing it depends on
//! changed (its spec, its Secret, its plugin), so that reading a location costs one plugin
//! call per configuration rather than one per reconcile.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::controller::provider_config::Provider;

#[derive(Debug, Default)]
pub struct Locations {
    by_name: Mutex<HashMap<String, (u64, String)>>,
}

impl Locations {
    /// The location `provider` answered, if its configuration has not changed since.
    pub fn get(&self, provider: &Provider) -> Option<String> {
        let map = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&provider.name)
            .filter(|(identity, _)| *identity == provider.identity)
            .map(|(_, location)| location.clone())
    }

    pub fn put(&self, provider: &Provider, location: String) {
        self.by_name
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(provider.name.clone(), (provider.identity, location));
    }

    /// Forgets a deleted ProviderConfig.
    pub fn remove(&self, name: &str) {
        self.by_name
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }
}
