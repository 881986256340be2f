//! Mounts that kubelet and containerd leave under a directory: kubelet's bind mount of its own
//! root (made rshared), projected and secret volumes (tmpfs), containers' overlay root
//! filesystems and sandboxes' `/dev/shm`. Detached deepest first, so the directory can then
//! be removed.

use std::io;
use std::path::{Path, PathBuf};

use super::sys;

/// Mount points at or below `dir`, in mount order (so stacked mounts come after the mounts
/// they cover).
pub fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect())
}

/// Detaches every mount at or below `dir`, the last mounted first; repeats while new ones
/// show up (a detached bind mount can uncover another), at most a few rounds. Returns the
/// mount points it could not detach, with why.
pub fn unmount_all_under(dir: &Path) -> Vec<(PathBuf, io::Error)> {
    let mut failed = Vec::new();
    for _ in 0..8 {
        let mounts = match mounts_under(dir) {
            Ok(mounts) => mounts,
            Err(error) => return vec![(PathBuf::from("/proc/self/mountinfo"), error)],
        };
        if mounts.is_empty() {
            return Vec::new();
        }
        failed.clear();
        for mount in mounts.iter().rev() {
            if let Err(error) = sys::unmount_detach(mount) {
                failed.push((mount.clone(), error));
            }
        }
    }
    failed
}

/// Decodes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match (byte, octal) {
            (b'\\', Some(decoded)) => {
                out.push(decoded);
                i += 4;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/plain/path"), "/plain/path");
        assert_eq!(unescape(r"/odd\"), r"/odd\");
    }
}
