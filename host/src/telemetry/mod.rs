//! Logs, metrics, events and health endpoints.

pub mod events;
pub mod logging;
