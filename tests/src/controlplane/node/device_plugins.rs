//! kubelet's device-plugin registration socket, the one path of kubelet's that several kubelets
//! on one host cannot each have: `/var/lib/kubelet/device-plugins/kubelet.sock` is hard-coded
//! (`pluginapi.KubeletSocket`, whatever `--root-dir` says). On start each kubelet deletes every
//! socket in that directory and listens there; one that deletes before another listens then
//! fails to listen ("address already in use") and exits. Once listening, a kubelet whose
//! socket was deleted by a later one goes on serving it unlinked, which harms no test (nothing
//! registers device plugins).
//!
//! So kubelets start one at a time: [`StartLock`] is an exclusive `flock` on that directory,
//! held from before a kubelet starts until its socket is there ([`socket_made_since`]). Being a
//! `flock`, it also orders the kubelets of other test processes that take it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The directory kubelet hard-codes for device plugins (`pluginapi.DevicePluginPath`).
pub const DIR: &str = "/var/lib/kubelet/device-plugins";
/// kubelet's registration socket in it (`pluginapi.KubeletSocket`).
const SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Held while one kubelet starts: released when dropped.
#[derive(Debug)]
pub struct StartLock {
    _dir: File,
}

impl StartLock {
    /// Makes [`DIR`] if needed (record first whether it existed: `kubelet_host_dirs`) and
    /// takes the lock, waiting for another holder until `timeout`.
    pub async fn acquire(timeout: Duration) -> io::Result<Self> {
        std::fs::create_dir_all(DIR)?;
        let dir = File::open(DIR)?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match dir.try_lock() {
                Ok(()) => return Ok(Self { _dir: dir }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(error)) => return Err(error),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("another kubelet held the lock on {DIR} for {timeout:?}"),
                ));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// Whether kubelet's registration socket is there, made at or after `since` (so by the kubelet
/// started then, not one before it).
pub fn socket_made_since(since: SystemTime) -> bool {
    std::fs::symlink_metadata(Path::new(SOCKET)).is_ok_and(|metadata| {
        metadata.file_type().is_socket()
            && metadata.modified().is_ok_and(|modified| modified >= since)
    })
}
