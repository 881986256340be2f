//! Logs, metrics, events and health endpoints.

pub mod logging;
