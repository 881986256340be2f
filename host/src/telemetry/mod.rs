//! Logs, metrics, events and health endpoints.

pub mod events;
pub mod health;
mod labels;
pub mod logging;
pub mod metrics;
mod phases;
pub mod server;
pub mod spans;
