//! Precompiled components on disk, authenticated, so a restarted operator maps its plugins
//! instead of compiling them again.
//!
//! # Guarantee: only artifacts this operator wrote are deserialized
//!
//! Deserializing a precompiled artifact runs its machine code: bytes from anyone else (another
//! build, a tampered or restored volume, a torn write) could do anything. Every artifact
//! therefore carries an HMAC-SHA256 under a key only this operator holds, over
//! `(plugin digest, engine compatibility hash, artifact bytes)`. A load reads the file into
//! memory once, verifies the tag (constant time) and deserializes those very bytes, so nothing
//! can change between check and use. A file whose tag does not verify — tampered, foreign,
//! written for another digest or engine, truncated — is deleted and the plugin recompiled
//! (`cache_restart::restarted_operator_loads_from_the_cache_and_refuses_a_flipped_byte` in tests/tests/operator/cache_restart.rs,
//! `cache::tests::*` here).
//!
//! # The key: a 0600 file on the cache volume
//!
//! The key is 32 random bytes in `.vmop-cache-key` in the cache directory, created with mode
//! 0600 (`create_new`, so two processes never race to different keys) and refused if it is a
//! symlink, not owned by this user, readable by others or not 32 bytes (then a fresh
//! in-memory key is used: this process's artifacts are trusted, a restart recompiles).
//!
//! Why a file and not a Secret: the cache volume is the pod's own `emptyDir`, writable only by
//! the operator's containers, and it lives exactly as long as the artifacts it authenticates. A
//! Secret would add RBAC (create/update Secrets) and an API round trip at start-up to protect
//! against one more party — someone who can write the operator's volume but not read a file
//! there owned by the operator's user — and that party can already replace the operator's
//! plugins or binary. The tag's real work is to refuse what this operator did not write:
//! artifacts from other builds, other engines, other digests, partial writes, a restored or
//! shared volume.
//!
//! # Size
//!
//! After every write the directory is pruned to [`DEFAULT_MAX_BYTES`] of artifacts, least
//! recently used first (a load refreshes an artifact's mtime); artifacts of other engine
//! configurations and temporary files of dead processes are removed at start-up, those of an
//! earlier incarnation with the same pid included (a container's operator is always PID 1)
//! (`cache::tests::prunes_oldest_first_and_other_engines`).
//!
//! Writes are atomic (temporary file in the same directory, then rename).

use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::engine::WasmError;
use key::{KEY_LEN, load_or_create_key, random_key};

mod key;

type HmacSha256 = Hmac<Sha256>;

/// Name of the key file in the cache directory.
pub const KEY_FILE: &str = ".vmop-cache-key";
/// Artifacts kept on disk: below the chart's 256 MiB `cache.sizeLimit`, so the kubelet never
/// evicts the pod for its cache.
pub const DEFAULT_MAX_BYTES: u64 = 192 << 20;
const MAGIC: &[u8; 8] = b"VMOPCW01";
const TAG_LEN: usize = 32;
const EXTENSION: &str = "cwasm";

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);
/// This process's mark on its temporary files: random, not the pid, which a container's
/// operator shares with every earlier incarnation of itself (it is always PID 1), so that the
/// files those left behind are recognised as stale.
static PROCESS_MARK: LazyLock<u64> =
    LazyLock::new(|| RandomState::new().hash_one(std::process::id()));

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("failed to create cache directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read cached artifact {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to write cached artifact {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to serialize the compiled component")]
    Serialize(#[source] WasmError),
    #[error("failed to deserialize cached artifact {path}")]
    Deserialize {
        path: PathBuf,
        #[source]
        source: WasmError,
    },
}

/// A directory of authenticated precompiled artifacts for one engine configuration.
#[derive(Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    /// Hex sha256 of the engine's compatibility hash: part of every file name and tag.
    engine_key: String,
    key: [u8; KEY_LEN],
    /// Whether `key` is persisted (artifacts survive a restart).
    persistent: bool,
    max_bytes: u64,
}

impl std::fmt::Debug for ArtifactCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactCache")
            .field("dir", &self.dir)
            .field("engine_key", &self.engine_key)
            .field("persistent", &self.persistent)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl ArtifactCache {
    /// Uses (and creates) `dir`, loading or creating its key, and removes artifacts of other
    /// engine configurations and leftover temporary files.
    pub fn new(dir: &Path, engine: &Engine) -> Result<Self, CacheError> {
        let create_err = |source| CacheError::CreateDir {
            path: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(create_err)?;
        let dir = fs::canonicalize(dir).map_err(create_err)?;
        let (key, persistent) = match load_or_create_key(&dir.join(KEY_FILE)) {
            Ok(key) => (key, true),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "plugin cache key unusable; precompiled plugins are trusted only until this process exits");
                (random_key().map_err(create_err)?, false)
            }
        };
        let cache = ArtifactCache {
            dir,
            engine_key: engine_key(engine),
            key,
            persistent,
            max_bytes: DEFAULT_MAX_BYTES,
        };
        cache.remove_foreign();
        Ok(cache)
    }

    /// Keeps at most `max_bytes` of artifacts.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Whether artifacts written now will be trusted after a restart.
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// The file of `digest`'s artifact.
    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir
            .join(format!("{digest}-{}.{EXTENSION}", self.engine_key))
    }

    /// The component for `digest` if its artifact verifies. `Ok(None)` means: compile it.
    pub fn load(&self, engine: &Engine, digest: &str) -> Result<Option<Component>, CacheError> {
        let path = self.path(digest);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        let Some(artifact) = self.verify(digest, &bytes) else {
            tracing::warn!(path = %path.display(), "cached plugin artifact failed authentication (tampered or not written by this operator); deleting it and recompiling");
            let _ = fs::remove_file(&path);
            return Ok(None);
        };
        // Least recently used pruning goes by mtime; a failure only makes this one older.
        let _ = File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        deserialize(engine, artifact)
            .map(Some)
            .map_err(|e| CacheError::Deserialize {
                path,
                source: e.into(),
            })
    }

    /// Writes the authenticated artifact of `component` atomically, then prunes.
    pub fn store(&self, digest: &str, component: &Component) -> Result<(), CacheError> {
        let artifact = component
            .serialize()
            .map_err(|e| CacheError::Serialize(e.into()))?;
        let path = self.path(digest);
        let tag = self.tag(digest, &artifact);
        let tmp = self.dir.join(format!(
            ".{digest}.{:x}.{}.tmp",
            *PROCESS_MARK,
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(MAGIC)?;
            file.write_all(&tag)?;
            file.write_all(&artifact)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        };
        if let Err(source) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(CacheError::Write { path, source });
        }
        self.prune();
        Ok(())
    }

    /// The artifact inside `file` if its magic and tag verify for `digest` and this engine.
    fn verify<'a>(&self, digest: &str, file: &'a [u8]) -> Option<&'a [u8]> {
        let rest = file.strip_prefix(MAGIC.as_slice())?;
        let (tag, artifact) = rest.split_at_checked(TAG_LEN)?;
        self.mac(digest, artifact).verify_slice(tag).ok()?;
        Some(artifact)
    }

    fn tag(&self, digest: &str, artifact: &[u8]) -> [u8; TAG_LEN] {
        self.mac(digest, artifact).finalize().into_bytes().into()
    }

    fn mac(&self, digest: &str, artifact: &[u8]) -> HmacSha256 {
        // Length-prefixed fields: no two different inputs encode alike.
        let mut mac = match HmacSha256::new_from_slice(&self.key) {
            Ok(mac) => mac,
            // HMAC takes keys of any length; this arm is unreachable.
            Err(_) => HmacSha256::new(&Default::default()),
        };
        for field in [
            b"vmop-precompiled-v1".as_slice(),
            digest.as_bytes(),
            self.engine_key.as_bytes(),
        ] {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field);
        }
        mac.update(artifact);
        mac
    }

    /// Artifacts of other engine configurations and temporary files of dead writers.
    fn remove_foreign(&self) {
        let own_tmp = format!(".{:x}.", *PROCESS_MARK);
        for (path, name, _) in self.entries() {
            let stale_tmp = name.ends_with(".tmp") && !name.contains(&own_tmp);
            let other_engine = name.ends_with(EXTENSION)
                && !name.ends_with(&format!("-{}.{EXTENSION}", self.engine_key));
            if stale_tmp || other_engine {
                let _ = fs::remove_file(path);
            }
        }
    }

    /// Deletes the least recently used artifacts until at most `max_bytes` remain.
    fn prune(&self) {
        let mut artifacts: Vec<(PathBuf, u64, SystemTime)> = self
            .entries()
            .into_iter()
            .filter(|(_, name, _)| name.ends_with(EXTENSION))
            .filter_map(|(path, _, meta)| {
                let modified = meta.modified().ok()?;
                Some((path, meta.len(), modified))
            })
            .collect();
        artifacts.sort_by_key(|(_, _, modified)| std::cmp::Reverse(*modified));
        let mut kept = 0u64;
        for (path, len, _) in artifacts {
            kept = kept.saturating_add(len);
            if kept > self.max_bytes {
                tracing::info!(path = %path.display(), "pruning least recently used plugin artifact");
                let _ = fs::remove_file(path);
            }
        }
    }

    fn entries(&self) -> Vec<(PathBuf, String, fs::Metadata)> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| {
                let meta = e.metadata().ok().filter(fs::Metadata::is_file)?;
                Some((e.path(), e.file_name().to_string_lossy().into_owned(), meta))
            })
            .collect()
    }
}

/// Feeds `Hash` output into SHA-256, so the engine's compatibility hash gets a stable,
/// collision-resistant name (`DefaultHasher` is neither).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

fn engine_key(engine: &Engine) -> String {
    let mut hasher = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(hasher.0.finalize())
}

/// Deserializes bytes whose tag [`ArtifactCache::verify`] checked.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `bytes` carry a valid HMAC under this operator's key over the digest, this
    // engine's compatibility hash and the bytes themselves: they are wasmtime's own output for
    // this configuration, written by this operator, and have not changed since (they were read
    // into memory once and verified there).
    unsafe { Component::deserialize(engine, bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn engine() -> Engine {
        Engine::default()
    }

    /// A minimal component: `(component)`.
    const EMPTY_COMPONENT: &[u8] = &[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    fn component(engine: &Engine) -> Component {
        Component::new(engine, EMPTY_COMPONENT).unwrap()
    }

    #[test]
    fn artifacts_survive_a_new_cache_over_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = ArtifactCache::new(dir.path(), &engine).unwrap();
        assert!(cache.is_persistent());
        cache.store("abc", &component(&engine)).unwrap();
        let key = dir.path().join(KEY_FILE);
        assert_eq!(fs::metadata(&key).unwrap().mode() & 0o777, 0o600);

        let restarted = ArtifactCache::new(dir.path(), &engine).unwrap();
        assert!(restarted.load(&engine, "abc").unwrap().is_some());
        assert!(restarted.load(&engine, "other").unwrap().is_none());
    }

    #[test]
    fn tampered_foreign_and_misnamed_artifacts_are_refused_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = ArtifactCache::new(dir.path(), &engine).unwrap();
        cache.store("abc", &component(&engine)).unwrap();
        let path = cache.path("abc");

        // One flipped byte in the machine code.
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(cache.load(&engine, "abc").unwrap().is_none());
        assert!(!path.exists(), "a refused artifact is deleted");

        // An artifact valid for another digest, renamed.
        cache.store("def", &component(&engine)).unwrap();
        fs::rename(cache.path("def"), &path).unwrap();
        assert!(cache.load(&engine, "abc").unwrap().is_none());

        // Raw wasmtime output without our header, and another operator's key.
        fs::write(&path, component(&engine).serialize().unwrap()).unwrap();
        assert!(cache.load(&engine, "abc").unwrap().is_none());
        let elsewhere = tempfile::tempdir().unwrap();
        let other = ArtifactCache::new(elsewhere.path(), &engine).unwrap();
        other.store("abc", &component(&engine)).unwrap();
        fs::copy(other.path("abc"), &path).unwrap();
        assert!(cache.load(&engine, "abc").unwrap().is_none());
    }

    #[test]
    fn prunes_oldest_first_and_other_engines() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let stray = dir
            .path()
            .join(format!("abc-{}.{EXTENSION}", "0".repeat(64)));
        fs::write(&stray, b"old engine").unwrap();
        let dead_tmp = dir.path().join(".abc.1.0.tmp");
        fs::write(&dead_tmp, b"partial").unwrap();
        // Left by an earlier incarnation with this process's pid (a container's PID 1).
        let same_pid = dir
            .path()
            .join(format!(".abc.{}.0.tmp", std::process::id()));
        fs::write(&same_pid, b"partial").unwrap();
        let cache = ArtifactCache::new(dir.path(), &engine).unwrap();
        assert!(!stray.exists() && !dead_tmp.exists() && !same_pid.exists());

        cache.store("one", &component(&engine)).unwrap();
        let size = fs::metadata(cache.path("one")).unwrap().len();
        let old = SystemTime::now() - std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(cache.path("one"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let cache = cache.with_max_bytes(size * 2);
        cache.store("two", &component(&engine)).unwrap();
        assert!(cache.path("one").exists());
        cache.store("three", &component(&engine)).unwrap();
        assert!(
            !cache.path("one").exists(),
            "the least recently used goes first"
        );
        assert!(cache.path("two").exists() && cache.path("three").exists());
    }
}
