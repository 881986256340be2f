//! The control plane's temporary directory. The shared control plane is never dropped, so its
//! directory (with etcd's data) outlives the test binary; each new one removes the directories
//! of processes that no longer exist (first stopping what a node of theirs left running or
//! mounted there, when the process was killed before its teardown).

use std::io;
use std::path::Path;

use tempfile::TempDir;

const PREFIX: &str = "vmop-controlplane-";

/// Creates `$TMPDIR/vmop-controlplane-<pid>-<random>` after removing stale siblings.
pub fn create() -> io::Result<TempDir> {
    let root = std::env::temp_dir();
    remove_stale(&root);
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-", std::process::id()))
        .tempdir_in(root)
}

fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // A node's shims, containers and mounts first, or the removal would fail on them.
            super::node::sweep_stale(&entry.path());
            // Best effort: another process may be removing it at the same time.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
