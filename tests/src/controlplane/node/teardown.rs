//! Stopping a node so that nothing of it is left: no container, shim, mount, cgroup or file
//! outside the control plane's directory, even when containerd could not be asked nicely.
//!
//! In order: kubelet and the scheduler are killed (nothing restarts containers any more);
//! containerd deletes every task and container it knows (`ctr tasks rm -f`, `ctr containers
//! rm`), which stops the shims and unmounts the containers' root filesystems; whatever still
//! runs in the node's cgroup root is killed and the root removed; shims still naming the
//! node's containerd socket are killed and their sockets (in containerd's hard-coded
//! `/run/containerd/s`) removed; containerd is killed; every mount under the node's directory
//! is detached; kubelet's hard-coded leftovers are removed (its symlinks in
//! `/var/log/containers` pointing into the node's directory, and `/var/lib/kubelet` when this
//! node made it).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{cgroups, mounts, sys};

/// Bound on each `ctr` call of the teardown.
const CTR_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Where containerd's shims put their sockets, whatever containerd's own state directory is.
const SHIM_SOCKETS: &str = "/run/containerd/s";
/// kubelet's symlinks to containers' logs (a path it hard-codes).
const CONTAINER_LOG_LINKS: &str = "/var/log/containers";
/// A node's directory in the control plane's is `node-<its address>`.
pub const NODE_DIR_PREFIX: &str = "node-";

/// Deletes every task and container of containerd's `k8s.io` namespace through `ctr`.
/// Returns what went wrong (the teardown goes on regardless).
pub fn remove_containers(ctr: &Path, socket: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (list, remove) in [
        (["tasks", "ls", "-q"], vec!["tasks", "rm", "-f"]),
        (["containers", "ls", "-q"], vec!["containers", "rm"]),
    ] {
        let ids = match run_ctr(ctr, socket, &list) {
            Ok(out) => out.lines().map(str::to_owned).collect::<Vec<_>>(),
            Err(error) => {
                problems.push(error);
                continue;
            }
        };
        if ids.is_empty() {
            continue;
        }
        let args: Vec<String> = remove.iter().map(|a| (*a).to_owned()).chain(ids).collect();
        if let Err(error) = run_ctr(ctr, socket, &args) {
            problems.push(error);
        }
    }
    problems
}

/// `ctr --address <socket> -n k8s.io <args>` with a deadline; its stdout, or why it failed.
fn run_ctr<S: AsRef<str>>(ctr: &Path, socket: &Path, args: &[S]) -> Result<String, String> {
    let described = args.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(" ");
    let mut command = Command::new(ctr);
    command
        .arg(format!("--address={}", socket.display()))
        .args(["-n", "k8s.io"])
        .args(args.iter().map(|a| OsString::from(a.as_ref())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command
        .spawn()
        .map_err(|error| format!("ctr {described}: {error}"))?;
    let output = wait_with_deadline(child, CTR_TIMEOUT)
        .map_err(|error| format!("ctr {described}: {error}"))?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err(format!(
            "ctr {described}: {} {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// Waits for `child` until `timeout`, killing it then.
fn wait_with_deadline(
    mut child: std::process::Child,
    timeout: Duration,
) -> io::Result<std::process::Output> {
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {timeout:?}"),
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The sockets of the shims whose bundles are under containerd's state directory `state`
/// (each bundle records its shim's address).
pub fn shim_sockets(state: &Path) -> Vec<PathBuf> {
    let mut sockets = Vec::new();
    let tasks = state.join("io.containerd.runtime.v2.task");
    for namespace in read_dir_paths(&tasks) {
        for bundle in read_dir_paths(&namespace) {
            for file in ["address", "bootstrap.json"] {
                let text = std::fs::read_to_string(bundle.join(file)).unwrap_or_default();
                sockets.extend(socket_paths_in(&text));
            }
        }
    }
    sockets
}

/// Every `/run/containerd/s/<64 hex digits>` named in `text`.
fn socket_paths_in(text: &str) -> Vec<PathBuf> {
    let prefix = format!("{SHIM_SOCKETS}/");
    text.match_indices(&prefix)
        .filter_map(|(at, _)| {
            let hash = text.get(at + prefix.len()..at + prefix.len() + 64)?;
            hash.bytes()
                .all(|b| b.is_ascii_hexdigit())
                .then(|| PathBuf::from(format!("{prefix}{hash}")))
        })
        .collect()
}

/// Removes the shim sockets left behind, and `/run/containerd/s` and `/run/containerd` if
/// that leaves them empty.
pub fn remove_shim_sockets(sockets: &[PathBuf]) {
    for socket in sockets {
        // Best effort: a shim that exited cleanly removed its own.
        let _ = std::fs::remove_file(socket);
    }
    // Only empty directories are removed; a failure means something else still uses them.
    let _ = std::fs::remove_dir(SHIM_SOCKETS);
    let _ = std::fs::remove_dir("/run/containerd");
}

/// Kills every containerd shim whose command line mentions `needle` (a shim names the
/// containerd socket it reports to, so the node's directory or socket singles its shims out).
pub fn kill_shims_mentioning(needle: &str) {
    for entry in read_dir_paths(Path::new("/proc")) {
        let Some(pid) = entry
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.join("cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
        let is_shim = args
            .next()
            .is_some_and(|program| program.ends_with("containerd-shim-runc-v2"));
        if is_shim && args.any(|arg| arg.contains(needle)) {
            // Best effort: it may have exited meanwhile.
            let _ = sys::kill(pid);
        }
    }
}

/// Removes kubelet's symlinks in `/var/log/containers` that point below `dir`.
pub fn remove_log_links(dir: &Path) {
    for link in read_dir_paths(Path::new(CONTAINER_LOG_LINKS)) {
        if std::fs::read_link(&link).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(&link);
        }
    }
}

/// Detaches every mount under `dir`, and kills and removes the node's cgroup root, reporting
/// what is left.
pub fn release(dir: &Path, cgroup_root: Option<&cgroups::CgroupRoot>) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(root) = cgroup_root {
        for (path, error) in root.remove() {
            problems.push(format!("cgroup {} not removed: {error}", path.display()));
        }
    }
    for (path, error) in mounts::unmount_all_under(dir) {
        problems.push(format!("{} not unmounted: {error}", path.display()));
    }
    problems
}

/// What a test binary killed before its teardown left in `dir` (a control plane's directory
/// whose process is gone): the shims of all its nodes are killed (with their containers, via
/// the cgroups of dead node processes) and its mounts detached, so that the directory can be
/// removed.
pub fn sweep_stale(dir: &Path) {
    // `node` is where the single node of earlier versions lived.
    let node_dirs: Vec<PathBuf> = read_dir_paths(dir)
        .into_iter()
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name == "node" || name.starts_with(NODE_DIR_PREFIX))
        })
        .collect();
    if node_dirs.is_empty() {
        return;
    }
    let sockets: Vec<PathBuf> = node_dirs
        .iter()
        .flat_map(|node| shim_sockets(&node.join("containerd/state")))
        .collect();
    kill_shims_mentioning(&dir.display().to_string());
    let _ = cgroups::remove_stale();
    let _ = mounts::unmount_all_under(dir);
    remove_shim_sockets(&sockets);
    remove_log_links(dir);
    kubelet_host_dirs::sweep();
}

/// The directories kubelet makes whatever its configuration says: `/var/lib/kubelet` (for
/// `device-plugins/`) and `/var/log/containers` (for its log symlinks), shared by every node
/// of every control plane of this process. Those that did not exist before the first node of
/// this process started are removed when the last one stops (the first only of what kubelet
/// puts there regardless of its root directory, the second only if empty).
pub mod kubelet_host_dirs {
    use std::path::Path;
    use std::sync::{Mutex, PoisonError};

    const LIB: &str = "/var/lib/kubelet";
    const LOG_LINKS: &str = super::CONTAINER_LOG_LINKS;

    struct State {
        nodes: usize,
        made_lib: bool,
        made_log_links: bool,
    }

    static STATE: Mutex<State> = Mutex::new(State {
        nodes: 0,
        made_lib: false,
        made_log_links: false,
    });

    /// Called before a node's kubelet starts.
    pub fn acquire() {
        let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        if state.nodes == 0 {
            state.made_lib = !Path::new(LIB).exists();
            state.made_log_links = !Path::new(LOG_LINKS).exists();
        }
        state.nodes += 1;
    }

    /// After a node process was killed before its teardown: removes what its kubelet left in
    /// those directories when no node of this process runs and they hold nothing a real
    /// kubelet would (a `/var/lib/kubelet` with `device-plugins/` alone, an empty
    /// `/var/log/containers`).
    pub fn sweep() {
        let state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        if state.nodes > 0 {
            return;
        }
        let only_device_plugins = std::fs::read_dir(LIB).is_ok_and(|entries| {
            entries
                .flatten()
                .all(|entry| entry.file_name() == "device-plugins")
        });
        // Best effort, and `remove_dir` only removes empty directories.
        if only_device_plugins {
            let _ = std::fs::remove_dir_all(Path::new(LIB).join("device-plugins"));
            let _ = std::fs::remove_dir(LIB);
        }
        let _ = std::fs::remove_dir(LOG_LINKS);
    }

    /// Called once that node is stopped.
    pub fn release() {
        let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        state.nodes = state.nodes.saturating_sub(1);
        if state.nodes > 0 {
            return;
        }
        // Best effort, and `remove_dir` only removes empty directories.
        if state.made_lib {
            let _ = std::fs::remove_dir_all(Path::new(LIB).join("device-plugins"));
            let _ = std::fs::remove_dir(LIB);
        }
        if state.made_log_links {
            let _ = std::fs::remove_dir(LOG_LINKS);
        }
    }
}

fn read_dir_paths(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_socket_paths_are_found_in_bundle_files() {
        let hash = "ab".repeat(32);
        let text = format!(r#"{{"address":"unix:///run/containerd/s/{hash}","protocol":"ttrpc"}}"#);
        assert_eq!(
            socket_paths_in(&text),
            vec![PathBuf::from(format!("/run/containerd/s/{hash}"))]
        );
        assert!(socket_paths_in("unix:///run/containerd/s/short").is_empty());
    }
}
