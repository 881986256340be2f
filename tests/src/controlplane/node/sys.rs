//! The two system calls the node's teardown needs that std lacks: killing a process by pid and
//! detaching a mount.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// Sends SIGKILL to `pid`. A process that is already gone is not an error.
#[allow(unsafe_code)]
pub fn kill(pid: i32) -> io::Result<()> {
    if pid <= 0 || u32::try_from(pid).ok() == Some(std::process::id()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to kill pid {pid}"),
        ));
    }
    // SAFETY: `kill` takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    match rc == 0 {
        true => Ok(()),
        false => match io::Error::last_os_error() {
            error if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            error => Err(error),
        },
    }
}

/// Detaches the mount at `path` (`umount2(MNT_DETACH)`): it disappears from the tree now, and
/// is released once nothing uses it.
#[allow(unsafe_code)]
pub fn unmount_detach(path: &Path) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    match rc == 0 {
        true => Ok(()),
        false => Err(io::Error::last_os_error()),
    }
}
