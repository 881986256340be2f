//! Importing OCI image archives into the node's containerd, where kubelet finds them (the
//! CRI plugin's `k8s.io` namespace), unpacked for its snapshotter.

use std::path::Path;

/// Runs `ctr images import` of `archive` (an OCI image layout as a tar file, e.g. from
/// `scripts/oci_image.py`, or a `docker save` one) into `socket`'s containerd. Returns
/// ctr's output (which names the images imported) or why it failed.
pub async fn import(ctr: &Path, socket: &Path, archive: &Path) -> Result<String, String> {
    let output = tokio::process::Command::new(ctr)
        .arg(format!("--address={}", socket.display()))
        .args(["--namespace", "k8s.io", "images", "import", "--local"])
        .arg(archive)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| format!("failed to run {}: {error}", ctr.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    match output.status.success() {
        true => Ok(text),
        false => Err(format!(
            "ctr images import {}: {}: {text}",
            archive.display(),
            output.status
        )),
    }
}
