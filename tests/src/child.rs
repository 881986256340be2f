//! Child processes that cannot outlive the test (or tool) that started them.

use std::io;
use std::process::Command;

/// How a child is tied to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Stays in our process group: a Ctrl-C in the terminal reaches it too.
    Inherit,
    /// Its own process group, so that the parent decides how and when it stops (the demo
    /// forwards Ctrl-C as SIGTERM and waits for a graceful shutdown).
    Own,
}

/// Asks the kernel to SIGKILL the child when the thread that forks it exits, so a test that
/// panics or is killed leaves no server behind; the child exits at once if this process died
/// between fork and `prctl`.
///
/// `PR_SET_PDEATHSIG` fires on the exit of the forking *thread*, not the process: callers that
/// must keep a child longer than the current thread spawn it from a long-lived thread
/// (see `controlplane::process`). Works for `tokio::process::Command` via `as_std_mut()`.
#[allow(unsafe_code)]
pub fn die_with_parent(command: &mut Command, group: Group) {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls the async-signal-safe
    // `setpgid`, `prctl` and `getppid`; it allocates only on the error path, where the child is
    // discarded.
    unsafe {
        command.pre_exec(move || {
            if group == Group::Own && libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::other("the parent exited before exec"));
            }
            Ok(())
        });
    }
}
