//! Runs a test control plane (etcd + kube-apiserver, optionally kube-controller-manager) until
//! SIGINT or SIGTERM, for demos and benchmarks. Once it is ready, prints two lines on stdout:
//! the admin kubeconfig path, then `export KUBECONFIG=<path>`. Progress goes to stderr.
//! On SIGINT/SIGTERM it stops the components and removes its directory; if it is killed, the
//! components die with it (and the next start removes the stale directory).
//!
//! ```text
//! cargo run -p vmop-tests --bin controlplane -- --controller-manager > /tmp/cp.env &
//! # once /tmp/cp.env has two lines:
//! eval "$(tail -1 /tmp/cp.env)"; kubectl get namespaces
//! ```

use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use vmop_tests::controlplane::{ControlPlane, Options};

#[derive(Debug, Parser)]
#[command(about = "Run a local Kubernetes control plane for vmop tests until interrupted")]
struct Args {
    /// Also start kube-controller-manager (garbage collector, namespace controller).
    #[arg(long)]
    controller_manager: bool,
    /// Also start a node (containerd, kubelet, kube-scheduler) that runs hostNetwork Pods.
    #[arg(long)]
    node: bool,
    /// Readiness deadline per component, in seconds.
    #[arg(long, env = vmop_tests::controlplane::TIMEOUT_ENV, default_value_t = 120)]
    timeout: u64,
    /// Extra kube-apiserver flag, e.g. `--apiserver-arg=--v=4` (repeatable).
    #[arg(
        long = "apiserver-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    apiserver_args: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut terminate = signal(SignalKind::terminate()).context("failed to watch SIGTERM")?;
    let options = Options {
        timeout: std::time::Duration::from_secs(args.timeout),
        apiserver_args: args.apiserver_args,
        nodes: usize::from(args.node),
    };
    let control_plane = ControlPlane::start_with(options)
        .await
        .context("failed to start the control plane")?;
    if args.controller_manager {
        control_plane
            .ensure_controller_manager()
            .await
            .context("failed to start kube-controller-manager")?;
    }
    print_kubeconfig(&control_plane);
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("failed to watch SIGINT")?,
        _ = terminate.recv() => {}
    }
    eprintln!("controlplane: stopping");
    drop(control_plane);
    Ok(())
}

/// Writes both lines at once. A closed stdout (the reader took the first line and left) is not
/// a reason to stop the control plane, so a failed write is only reported.
fn print_kubeconfig(control_plane: &ControlPlane) {
    use std::io::Write as _;
    let kubeconfig = control_plane.kubeconfig().display();
    let text = format!("{kubeconfig}\nexport KUBECONFIG={kubeconfig}\n");
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        eprintln!("controlplane: cannot print the kubeconfig path to stdout: {error}");
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn arguments_are_consistent() {
        super::Args::command().debug_assert();
    }
}
