//! `--in-cluster`: the operator as a Pod of the test node, from the image built here, installed by
//! `helm install charts/vmop`, its ec2 plugin from an OCI image volume (`plugins.images`).
//! The node reaches everything on loopback only: the chart values it needs are those of
//! deploy/README.md, "Running on a loopback-only node".

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::Context as _;
use vmop_tests::controlplane::ControlPlane;
use vmop_tests::incluster::{
    NAMESPACE, free_port, image, install, is_ready, node_values, operator_namespace, wait_pods,
};

/// The ProviderConfig's plugin path: the `ec2` image volume's file.
pub const PLUGIN_PATH: &str = "ec2/ec2.wasm";
const PLUGIN_IMAGE: &str = "docker.io/vmop/ec2-plugin:demo";

/// Builds the two images, imports them into the node, installs the chart and waits for the
/// operator Pod to be Ready; returns where the Pod serves `/metrics`.
pub async fn install_operator(
    control_plane: &ControlPlane,
    vmop: &Path,
    dir: &Path,
) -> anyhow::Result<SocketAddr> {
    let vmop = vmop.display().to_string();
    image(
        control_plane,
        &[
            "operator",
            "--binary",
            &vmop,
            "--name",
            "docker.io/vmop/vmop:test",
        ],
        &dir.join("vmop.tar"),
    )
    .await?;
    let wasm = dir.join("ec2.wasm");
    std::fs::copy(vmop_tests::wasm::path("vmop_provider_ec2")?, &wasm)
        .context("failed to copy the ec2 plugin")?;
    let digest = image(
        control_plane,
        &[
            "plugin",
            "--wasm",
            &wasm.display().to_string(),
            "--name",
            PLUGIN_IMAGE,
        ],
        &dir.join("ec2-plugin.tar"),
    )
    .await?;
    eprintln!("demo:   images imported into the node; the ec2 plugin is {digest}");
    operator_namespace(control_plane).await?;
    let port = free_port()?;
    let values = node_values(control_plane, port, &[("ec2", PLUGIN_IMAGE)])?;
    install(control_plane, &values).await?;
    let client = control_plane.client().await?;
    wait_pods(&client, control_plane, "the operator Pod Ready", |pods| {
        !pods.is_empty() && pods.iter().all(is_ready)
    })
    .await?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// How to read the Pod's log.
pub fn log_command() -> String {
    format!("kubectl logs -n {NAMESPACE} deploy/vmop -f")
}
