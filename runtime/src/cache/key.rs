//! The cache's HMAC key: 32 random bytes in a 0600 file on the cache volume (why a file, and
//! not a Secret, is in the parent module's docs).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

pub(super) const KEY_LEN: usize = 32;

pub(super) fn random_key() -> io::Result<[u8; KEY_LEN]> {
    let mut key = [0u8; KEY_LEN];
    File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(key)
}

/// The key in `path`, created (0600, exclusively) when absent.
pub(super) fn load_or_create_key(path: &Path) -> io::Result<[u8; KEY_LEN]> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            let key = random_key()?;
            file.write_all(&key)?;
            file.sync_all()?;
            return Ok(key);
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(path)?;
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    if !meta.file_type().is_file() {
        return Err(invalid("the key file is not a regular file"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(invalid("the key file is accessible to other users"));
    }
    if meta.uid() != current_uid()? {
        return Err(invalid("the key file belongs to another user"));
    }
    let bytes = fs::read(path)?;
    bytes
        .try_into()
        .map_err(|_| invalid("the key file does not hold 32 bytes"))
}

/// This process's effective uid, read from `/proc/self` (no `unsafe`).
fn current_uid() -> io::Result<u32> {
    Ok(fs::metadata("/proc/self")?.uid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{ArtifactCache, KEY_FILE};
    use wasmtime::Engine;

    #[test]
    fn an_unsafe_key_file_is_not_trusted_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join(KEY_FILE);
        fs::write(&key, [7u8; KEY_LEN]).unwrap();
        fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let cache = ArtifactCache::new(dir.path(), &Engine::default()).unwrap();
        assert!(!cache.is_persistent());
    }

    #[test]
    fn a_missing_key_is_created_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let first = load_or_create_key(&path).unwrap();
        assert_eq!(load_or_create_key(&path).unwrap(), first);
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    }
}
