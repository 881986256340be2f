//! Logging through the host's `log` import: lines land in the operator's structured log,
//! tagged with the plugin's name. Never log secrets or whole request bodies that carry them.

use crate::bindings::vmop::provider::log::{Level, log};

pub fn trace(message: &str) {
    log(Level::Trace, message);
}

pub fn debug(message: &str) {
    log(Level::Debug, message);
}

pub fn info(message: &str) {
    log(Level::Info, message);
}

pub fn warn(message: &str) {
    log(Level::Warn, message);
}

pub fn error(message: &str) {
    log(Level::Error, message);
}

/// `debug!("created {id}")`: formats and logs at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::debug(&::std::format!($($arg)*)) };
}

/// `info!("created {id}")`: formats and logs at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::info(&::std::format!($($arg)*)) };
}

/// `warn!("retrying {id}")`: formats and logs at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log::warn(&::std::format!($($arg)*)) };
}
