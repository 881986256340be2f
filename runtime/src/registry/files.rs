//! Where plugin files come from: paths confined to the plugin directory, sha256 pins, the
//! metadata that tells a changed file, bounded streaming reads, and the WIT version rule.
//!
//! # Guarantee: a plugin file costs at most its bound in memory
//!
//! A file larger than the registry's bound (default [`DEFAULT_MAX_PLUGIN_BYTES`]) is refused
//! before anything is read ([`LoadError::TooLarge`]); the digest is computed streaming, in
//! [`CHUNK`]-sized reads, and the whole file is read into memory only to be compiled, and never
//! beyond the bound even if it grows meanwhile (`loading_limits::oversized_plugin_is_refused_with_bounded_rss`
//! in tests/tests/sandbox/loading_limits.rs).

use std::io::Read;
use std::path::{Component as PathPart, Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::LoadError;

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

/// The default bound on a plugin file: a Rust provider is a few hundred KiB, a Python or
/// JavaScript one about 20 MiB.
pub const DEFAULT_MAX_PLUGIN_BYTES: u64 = 64 << 20;
/// Read size of the streaming digest.
const CHUNK: usize = 64 << 10;

/// Lowercase hex sha256 of `full`, read in chunks; [`LoadError::TooLarge`] past `max` bytes.
/// Blocking: call it on the blocking pool.
pub(crate) fn digest_file(rel: &Path, full: &Path, max: u64) -> Result<String, LoadError> {
    let mut file = std::fs::File::open(full).map_err(LoadError::read(rel))?;
    check_len(
        rel,
        file.metadata().map_err(LoadError::read(rel))?.len(),
        max,
    )?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut seen: u64 = 0;
    loop {
        let n = file.read(&mut buf).map_err(LoadError::read(rel))?;
        if n == 0 {
            break;
        }
        seen = seen.saturating_add(n as u64);
        check_len(rel, seen, max)?;
        hasher.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The whole of `full`, at most `max` bytes, and its digest. Blocking.
pub(crate) fn read_file(rel: &Path, full: &Path, max: u64) -> Result<(Vec<u8>, String), LoadError> {
    let file = std::fs::File::open(full).map_err(LoadError::read(rel))?;
    let len = file.metadata().map_err(LoadError::read(rel))?.len();
    check_len(rel, len, max)?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // One byte past the bound tells a file that grew since the check.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(LoadError::read(rel))?;
    check_len(rel, bytes.len() as u64, max)?;
    let digest = hex::encode(Sha256::digest(&bytes));
    Ok((bytes, digest))
}

fn check_len(rel: &Path, len: u64, max: u64) -> Result<(), LoadError> {
    if len > max {
        return Err(LoadError::TooLarge {
            path: rel.to_path_buf(),
            limit: max,
        });
    }
    Ok(())
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
    fn files_over_the_bound_are_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.wasm");
        std::fs::write(&path, vec![0u8; 100_000]).unwrap();
        let rel = Path::new("big.wasm");
        assert!(matches!(
            digest_file(rel, &path, 99_999),
            Err(LoadError::TooLarge { limit: 99_999, .. })
        ));
        assert!(matches!(
            read_file(rel, &path, 99_999),
            Err(LoadError::TooLarge { .. })
        ));
        let digest = digest_file(rel, &path, 100_000).unwrap();
        let (bytes, again) = read_file(rel, &path, 100_000).unwrap();
        assert_eq!((bytes.len(), digest), (100_000, again));
    }
}
