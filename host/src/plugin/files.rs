//! Where plugin files come from: paths confined to the plugin directory, sha256 pins, the
//! metadata that tells a changed file, and the WIT version rule.

use std::path::{Component as PathPart, Path, PathBuf};
use std::time::SystemTime;

use super::registry::LoadError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl FileStamp {
    pub(crate) async fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = tokio::fs::metadata(path).await?;
        Ok(FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode: meta.ino(),
        })
    }
}

/// `path` as a normalized relative path with no `..`, root or prefix.
pub(crate) fn relative(path: &Path) -> Result<PathBuf, LoadError> {
    let invalid = |reason| LoadError::InvalidPath {
        path: path.to_path_buf(),
        reason,
    };
    let mut rel = PathBuf::new();
    for part in path.components() {
        match part {
            PathPart::Normal(p) => rel.push(p),
            PathPart::CurDir => {}
            PathPart::ParentDir => return Err(invalid("must not contain `..`")),
            PathPart::RootDir | PathPart::Prefix(_) => {
                return Err(invalid("must be relative to the plugin directory"));
            }
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(invalid("is empty"));
    }
    Ok(rel)
}

/// Lowercase hex of a pin given as `<hex>` or `sha256:<hex>`.
pub(crate) fn parse_pin(pin: &str) -> Result<String, LoadError> {
    let hex = pin.trim();
    let hex = hex.strip_prefix("sha256:").unwrap_or(hex);
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(LoadError::InvalidPin {
            pin: pin.to_string(),
        });
    }
    Ok(hex.to_ascii_lowercase())
}

pub(crate) fn check_pin(pin: Option<&str>, digest: &str) -> Result<(), LoadError> {
    match pin {
        Some(expected) if expected != digest => Err(LoadError::DigestMismatch {
            expected: expected.to_string(),
            actual: digest.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Same major and minor (0.x minors are breaking, see `wit/provider.wit`).
pub(crate) fn wit_compatible(plugin: &str, host: &str) -> bool {
    let major_minor = |v: &str| {
        let mut parts = v.trim().split('.');
        Some((
            parts.next()?.parse::<u64>().ok()?,
            parts.next()?.parse::<u64>().ok()?,
        ))
    };
    matches!((major_minor(plugin), major_minor(host)), (Some(p), Some(h)) if p == h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_inside() {
        assert_eq!(
            relative(Path::new("./a/b.wasm")).ok(),
            Some(PathBuf::from("a/b.wasm"))
        );
        assert!(relative(Path::new("../x.wasm")).is_err());
        assert!(relative(Path::new("a/../../x.wasm")).is_err());
        assert!(relative(Path::new("/etc/passwd")).is_err());
        assert!(relative(Path::new("")).is_err());
    }

    #[test]
    fn pins_are_hex_sha256() {
        let hex = "AB".repeat(32);
        assert_eq!(parse_pin(&hex).ok(), Some("ab".repeat(32)));
        assert_eq!(
            parse_pin(&format!("sha256:{hex}")).ok(),
            Some("ab".repeat(32))
        );
        assert!(parse_pin("abc").is_err());
        assert!(parse_pin(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn wit_versions_compare_major_and_minor() {
        assert!(wit_compatible("0.1.0", "0.1.0"));
        assert!(wit_compatible("0.1.7", "0.1.0"));
        assert!(!wit_compatible("0.2.0", "0.1.0"));
        assert!(!wit_compatible("1.1.0", "0.1.0"));
        assert!(!wit_compatible("garbage", "0.1.0"));
    }
}
