//! A registry over one plugin file, for the commands that try a single plugin outside the
//! operator (`vmop plugin call`, `inspect`, `conformance`): the same loading path the operator
//! uses, with an engine sized for a few instances and no disk cache.

use std::path::{Path, PathBuf};

use super::{LoadError, PluginRegistry, RegistryConfig};
use crate::engine::{EngineConfig, EngineError, PluginEngine};
use crate::sandbox::CallLimits;

/// Why no registry could be made over a file.
#[derive(Debug, thiserror::Error)]
pub enum SingleFileError {
    #[error("the plugin path {0} names no file")]
    NoFile(PathBuf),
    #[error("failed to create the plugin engine")]
    Engine(#[from] EngineError),
    #[error("failed to open the plugin's directory")]
    Directory(#[source] LoadError),
}

impl PluginRegistry {
    /// A registry over `file`'s directory and the file's name within it, calls bounded by
    /// `limits` (the engine's memory is at least `limits.memory_bytes`).
    pub fn over_file(
        file: &Path,
        limits: CallLimits,
    ) -> Result<(PluginRegistry, PathBuf), SingleFileError> {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = file
            .file_name()
            .ok_or_else(|| SingleFileError::NoFile(file.to_path_buf()))?;
        let engine = PluginEngine::new(&EngineConfig {
            max_instances: 4,
            max_memory_bytes: limits
                .memory_bytes
                .max(EngineConfig::default().max_memory_bytes),
            ..EngineConfig::default()
        })?;
        let registry = PluginRegistry::new(
            engine,
            RegistryConfig {
                plugin_dir: dir,
                cache_dir: None,
                info_limits: limits,
            },
        )
        .map_err(SingleFileError::Directory)?;
        Ok((registry, PathBuf::from(name)))
    }
}
