//! The node's own cgroup root (kubelet's `cgroupRoot`): `/vmop-node-<pid>-<n>` in every cgroup
//! hierarchy, so that its Pods' cgroups (`<root>/kubepods/...`) are apart from any other
//! node's, and removing the root after the node stops kills what is left of its containers and
//! leaves nothing behind.
//!
//! kubelet refuses to start unless the root exists in each hierarchy, so it is made here.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::sys;

const PREFIX: &str = "vmop-node-";
/// How long removing a root may wait for its processes to die.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// One cgroup root, made in every mounted hierarchy.
#[derive(Debug)]
pub struct CgroupRoot {
    name: String,
    dirs: Vec<PathBuf>,
}

impl CgroupRoot {
    /// Makes `/vmop-node-<our pid>-<n>` in every cgroup v1 hierarchy (cgroupfs, as kubelet's
    /// `cgroupDriver: cgroupfs` expects), or in the unified hierarchy on a host with cgroup v2
    /// alone. Its cpuset gets the parent's CPUs and memory nodes, without which no process
    /// could join it.
    pub fn create() -> io::Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut root = Self {
            name,
            dirs: Vec::new(),
        };
        let mut hierarchies = hierarchies(false)?;
        let unified_only = hierarchies.is_empty();
        if unified_only {
            hierarchies = self::hierarchies(true)?;
        }
        for hierarchy in hierarchies {
            let dir = hierarchy.join(&root.name);
            let made = std::fs::create_dir(&dir)
                .map(|()| root.dirs.push(dir.clone()))
                .and_then(|()| prepare(&hierarchy, &dir, unified_only));
            if let Err(error) = made {
                remove_trees(&root.dirs);
                return Err(error);
            }
        }
        Ok(root)
    }

    /// The root as kubelet names it: `/vmop-node-...`.
    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }

    /// Kills every process left in the root (in any hierarchy, also the unified one kubelet or
    /// runc may have used) and removes its cgroups, deepest first. Returns what could not be
    /// removed within a few seconds.
    pub fn remove(&self) -> Vec<(PathBuf, io::Error)> {
        let dirs: Vec<PathBuf> = match hierarchies(true) {
            Ok(hierarchies) => hierarchies.iter().map(|h| h.join(&self.name)).collect(),
            Err(error) => return vec![(PathBuf::from("/proc/self/mountinfo"), error)],
        };
        remove_trees(&dirs)
    }
}

/// Readies a new cgroup `dir` below `hierarchy`'s root: the parent's cpuset, and on cgroup v2
/// the root's controllers handed down, as a delegating parent does.
fn prepare(hierarchy: &Path, dir: &Path, unified: bool) -> io::Result<()> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if hierarchy.join(file).exists() {
            std::fs::write(dir.join(file), std::fs::read(hierarchy.join(file))?)?;
        }
    }
    if unified {
        let controllers = std::fs::read_to_string(hierarchy.join("cgroup.subtree_control"))?;
        let enable: Vec<String> = controllers
            .split_whitespace()
            .map(|c| format!("+{c}"))
            .collect();
        std::fs::write(dir.join("cgroup.subtree_control"), enable.join(" "))?;
    }
    Ok(())
}

/// Removes the roots of node processes that are gone (a test binary killed before its
/// teardown ran), with whatever still runs in them.
pub fn remove_stale() -> Vec<(PathBuf, io::Error)> {
    let Ok(hierarchies) = hierarchies(true) else {
        return Vec::new();
    };
    let stale: Vec<PathBuf> = hierarchies
        .iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|entry| {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|name| name.strip_prefix(PREFIX))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .map(|entry| entry.path())
        .collect();
    remove_trees(&stale)
}

/// Kills the processes of the cgroup trees at `dirs` and removes them, polling until they are
/// gone or a deadline passes.
fn remove_trees(dirs: &[PathBuf]) -> Vec<(PathBuf, io::Error)> {
    let deadline = Instant::now() + REMOVE_TIMEOUT;
    loop {
        let mut failed = Vec::new();
        for dir in dirs.iter().filter(|dir| dir.exists()) {
            let mut tree = Vec::new();
            collect_tree(dir, &mut tree);
            // Deepest first: a cgroup can only be removed once its children are.
            for cgroup in tree.iter().rev() {
                for pid in procs(cgroup) {
                    // Best effort: a failure shows up as the rmdir below failing.
                    let _ = sys::kill(pid);
                }
                match std::fs::remove_dir(cgroup) {
                    Err(error) if error.kind() != io::ErrorKind::NotFound => {
                        failed.push((cgroup.clone(), error));
                    }
                    _ => {}
                }
            }
        }
        if failed.is_empty() || Instant::now() >= deadline {
            return failed;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// `dir` and every cgroup below it, parents before children.
fn collect_tree(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_tree(&entry.path(), out);
        }
    }
}

fn procs(cgroup: &Path) -> Vec<i32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Mount points of the cgroup v1 hierarchies, and of the v2 one when `with_unified`.
fn hierarchies(with_unified: bool) -> io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let mount_point = line.split(' ').nth(4)?;
            let fs_type = line.split(" - ").nth(1)?.split(' ').next()?;
            let wanted = fs_type == "cgroup" || (with_unified && fs_type == "cgroup2");
            wanted.then(|| PathBuf::from(mount_point))
        })
        .collect())
}
