//! The one-command demo (`scripts/demo.sh`): a local control plane, moto's EC2 API, and `vmop run`
//! with the ec2 plugin; a ProviderConfig, its Secret and three VirtualMachines from
//! `deploy/samples/`. Once the machines are Running it prints `kubectl get vm` and how to use the
//! cluster, then runs until SIGINT or SIGTERM and stops everything it started.
//!
//! Progress and the time of each step go to stderr; the result (the table, the kubeconfig, the
//! addresses) goes to stdout. `--exit-when-ready` stops everything and exits 0 right after
//! printing, for tests and CI.

#[path = "demo/incluster.rs"]
mod incluster;
#[path = "demo/objects.rs"]
mod objects;
#[path = "demo/operator.rs"]
mod operator;
#[path = "demo/report.rs"]
mod report;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tokio::signal::unix::{Signal, SignalKind, signal};
use vmop::api::{VirtualMachine, VmPhase};
use vmop_tests::controlplane::ControlPlane;
use vmop_tests::moto::Moto;

use objects::{DEMO_NAMESPACE, OPERATOR_NAMESPACE, Objects, PLUGIN_FILE, VMS};
use operator::{Launch, Operator};

/// How long the operator may take to shut down after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Parser)]
#[command(about = "Run vmop with the ec2 plugin against moto on a local control plane")]
struct Args {
    /// Stop everything and exit 0 as soon as the VMs are Running and the summary is printed.
    #[arg(long)]
    exit_when_ready: bool,
    /// The `vmop` binary [default: `vmop` next to this program, where
    /// `cargo build -p vmop --bin vmop` puts it].
    #[arg(long, env = "VMOP_BIN")]
    vmop: Option<PathBuf>,
    /// How long the VirtualMachines may take to become Running, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Run the operator as a Pod on a real node (kubelet, containerd, runc) from the image
    /// built here, installed by `helm install charts/vmop`, its plugin from an image volume.
    #[arg(long)]
    in_cluster: bool,
}

/// Everything the demo started. Fields drop in declaration order: the operator before moto
/// before the control plane, and the files last.
#[derive(Debug)]
struct Demo {
    operator: Runner,
    moto: Moto,
    control_plane: ControlPlane,
    metrics_addr: SocketAddr,
    dir: tempfile::TempDir,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Registered first, so a Ctrl-C during start-up stops what was started instead of killing
    // the demo outright.
    let mut signals = Signals::new()?;
    let vmop = locate_vmop(args.vmop)?;
    let started = Instant::now();
    let mut demo = tokio::select! {
        demo = Demo::start(&vmop, Duration::from_secs(args.timeout), args.in_cluster) => demo?,
        name = signals.recv() => bail!("interrupted by {name} during start-up; stopped what was started"),
    };
    eprintln!(
        "demo: ready in {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    let table = step("running kubectl get vm -A -o wide", demo.kubectl_get_vms()).await?;
    report::print(&report::Summary {
        table: &table,
        control_plane: &demo.control_plane,
        moto_endpoint: &demo.moto.endpoint(),
        operator_log: &demo.operator.log_hint(),
        metrics_addr: demo.metrics_addr,
        dir: demo.dir.path(),
        waits_for_signal: !args.exit_when_ready,
    })?;

    let outcome = if args.exit_when_ready {
        Ok(())
    } else {
        tokio::select! {
            name = signals.recv() => {
                eprintln!("demo: {name} received");
                Ok(())
            }
            status = demo.operator.wait() => Err(anyhow::anyhow!(
                "the operator exited unexpectedly ({}); the end of its log:\n{}",
                status?,
                demo.operator.log_tail()
            )),
        }
    };
    step(
        "stopping the operator, moto and the control plane",
        demo.stop(),
    )
    .await?;
    outcome
}

impl Demo {
    async fn start(vmop: &Path, timeout: Duration, in_cluster: bool) -> anyhow::Result<Self> {
        let control_plane = if in_cluster {
            step(
                "starting the control plane and a node (kubelet, containerd, runc)",
                async { Ok(ControlPlane::with_node().await?) },
            )
            .await?
        } else {
            step("starting the control plane (etcd, kube-apiserver)", async {
                Ok(ControlPlane::start().await?)
            })
            .await?
        };
        // On this (main) thread, not a blocking-pool thread: moto dies with the thread that
        // started it, and pool threads exit when idle.
        let moto = step("starting moto (EC2 API)", async { Ok(Moto::start()?) }).await?;
        let client = control_plane.client().await?;

        let dir = tempfile::Builder::new().prefix("vmop-demo-").tempdir()?;
        let plugin_dir = dir.path().join("plugins");
        let cache_dir = dir.path().join("cache");
        if in_cluster {
            let metrics_addr = step(
                "building the operator and plugin images, helm install charts/vmop",
                incluster::install_operator(&control_plane, vmop, dir.path()),
            )
            .await?;
            step(
                "applying the ec2 ProviderConfig, Secret and 3 VirtualMachines",
                async {
                    let mut objects = Objects::for_endpoint(&moto.endpoint())?;
                    objects.provider_config.spec.plugin.path = incluster::PLUGIN_PATH.to_owned();
                    objects.apply(&client).await
                },
            )
            .await?;
            let mut operator = Runner::Pods;
            let vms = Api::<VirtualMachine>::namespaced(client, DEMO_NAMESPACE);
            step(
                "waiting for the VirtualMachines to be Running",
                wait_running(&vms, &mut operator, timeout),
            )
            .await?;
            return Ok(Self {
                operator,
                moto,
                control_plane,
                metrics_addr,
                dir,
            });
        }
        step(
            "installing the CRDs, ec2 ProviderConfig, Secret and 3 VirtualMachines",
            async {
                for sub in [&plugin_dir, &cache_dir] {
                    std::fs::create_dir(sub)
                        .with_context(|| format!("failed to create {}", sub.display()))?;
                }
                let wasm = vmop_tests::wasm::path("vmop_provider_ec2")?;
                std::fs::copy(wasm, plugin_dir.join(PLUGIN_FILE))
                    .with_context(|| format!("failed to copy {}", wasm.display()))?;
                vmop_tests::operator::install_crds(&client).await?;
                Objects::for_endpoint(&moto.endpoint())?
                    .apply(&client)
                    .await
            },
        )
        .await?;
        step(
            "starting kube-controller-manager (garbage collector, namespace controller)",
            async { Ok(control_plane.ensure_controller_manager().await?) },
        )
        .await?;

        let metrics_addr = free_loopback_addr()?;
        let operator = step("starting the operator (vmop run)", async {
            Launch {
                bin: vmop,
                kubeconfig: control_plane.kubeconfig(),
                plugin_dir: &plugin_dir,
                cache_dir: &cache_dir,
                operator_namespace: OPERATOR_NAMESPACE,
                metrics_addr,
                log: dir.path().join("operator.log"),
            }
            .start()
        })
        .await?;
        eprintln!(
            "demo: the operator logs to {}",
            operator.log_path().display()
        );
        let mut operator = Runner::Process(Box::new(operator));
        let vms = Api::<VirtualMachine>::namespaced(client, DEMO_NAMESPACE);
        step(
            "waiting for the VirtualMachines to be Running",
            wait_running(&vms, &mut operator, timeout),
        )
        .await?;
        Ok(Self {
            operator,
            moto,
            control_plane,
            metrics_addr,
            dir,
        })
    }

    /// `kubectl get vm -A -o wide` with the admin kubeconfig, as the user would see it.
    async fn kubectl_get_vms(&self) -> anyhow::Result<String> {
        let mut command = self.control_plane.kubectl_command();
        command.args(["get", "vm", "-A", "-o", "wide"]);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await?
            .context("failed to run kubectl")?;
        if !output.status.success() {
            bail!(
                "kubectl get vm failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Stops the operator gracefully, then moto and the control plane, and removes the files.
    async fn stop(mut self) -> anyhow::Result<()> {
        let operator_pid = self.operator.pid();
        self.operator.stop(STOP_GRACE).await?;
        let control_plane_pids = self.control_plane.pids();
        let dir = self.dir.path().to_path_buf();
        drop(self);
        eprintln!(
            "demo: stopped the operator (pid {}), moto and the control plane (pids {})",
            operator_pid.map_or_else(|| "?".to_owned(), |pid| pid.to_string()),
            control_plane_pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        );
        eprintln!("demo: removed {}", dir.display());
        Ok(())
    }
}

/// Waits until every demo VM is Running with an id and `Ready=True`, printing each as it gets
/// there. Fails when the operator exits or after `timeout`, quoting the VMs and the operator's
/// log.
async fn wait_running(
    vms: &Api<VirtualMachine>,
    operator: &mut Runner,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut running = BTreeSet::new();
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    loop {
        tick.tick().await;
        if let Some(status) = operator.exited()? {
            bail!(
                "the operator exited ({status}) before the VirtualMachines were Running; the end \
                 of its log (removed with the demo's files):\n{}",
                operator.log_tail()
            );
        }
        // A failed list is retried until the deadline, then reported.
        let listed = vms.list(&ListParams::default()).await;
        for vm in listed.iter().flat_map(|list| &list.items) {
            if let Some(id) = running_id(vm)
                && running.insert(vm.name_any())
            {
                eprintln!(
                    "demo:   {} is Running as {id} after {:.1} s",
                    vm.name_any(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        if VMS.iter().all(|(name, ..)| running.contains(*name)) {
            return Ok(());
        }
        if started.elapsed() > timeout {
            let seen = match &listed {
                Ok(list) => list
                    .items
                    .iter()
                    .map(describe)
                    .collect::<Vec<_>>()
                    .join("\n"),
                Err(error) => format!("  (listing them failed: {error})"),
            };
            bail!(
                "the VirtualMachines were not all Running within {timeout:?}:\n{seen}\nthe end of \
                 the operator's log (removed with the demo's files):\n{}",
                operator.log_tail()
            );
        }
    }
}

/// The operator: a child process, or the Pods of `--in-cluster` (the node's to run and stop).
#[derive(Debug)]
enum Runner {
    Process(Box<Operator>),
    Pods,
}

impl Runner {
    fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        match self {
            Runner::Process(operator) => operator.exited(),
            Runner::Pods => Ok(None),
        }
    }

    async fn wait(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        match self {
            Runner::Process(operator) => operator.wait().await,
            Runner::Pods => std::future::pending().await,
        }
    }

    fn log_tail(&self) -> String {
        match self {
            Runner::Process(operator) => operator.log_tail(),
            Runner::Pods => format!("(see `{}`)", incluster::log_command()),
        }
    }

    /// Where to read the operator's log, for the summary.
    fn log_hint(&self) -> String {
        match self {
            Runner::Process(operator) => {
                format!("{}   (tail -f it)", operator.log_path().display())
            }
            Runner::Pods => incluster::log_command(),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Runner::Process(operator) => operator.pid(),
            Runner::Pods => None,
        }
    }

    async fn stop(&mut self, grace: Duration) -> anyhow::Result<()> {
        match self {
            Runner::Process(operator) => operator.stop(grace).await,
            Runner::Pods => Ok(()),
        }
    }
}

/// The instance id of a VM that is Running, observed so (`Ready=True`).
fn running_id(vm: &VirtualMachine) -> Option<&str> {
    let status = vm.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    (status.phase == Some(VmPhase::Running) && ready)
        .then_some(status.id.as_deref())
        .flatten()
}

/// One VM's phase, id and conditions, for a timeout message.
fn describe(vm: &VirtualMachine) -> String {
    let Some(status) = &vm.status else {
        return format!("  {}: no status yet", vm.name_any());
    };
    let conditions = status
        .conditions
        .iter()
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "  {}: phase {:?}, id {:?}, {conditions}",
        vm.name_any(),
        status.phase,
        status.id
    )
}

/// Runs one step of the demo, saying what it does and how long it took.
async fn step<T>(what: &str, work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    eprintln!("demo: {what} ...");
    let started = Instant::now();
    let value = work
        .await
        .with_context(|| format!("demo step failed: {what}"))?;
    eprintln!(
        "demo: {what}: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(value)
}

fn locate_vmop(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => std::env::current_exe()
            .context("failed to find this program's path")?
            .with_file_name("vmop"),
    };
    if !path.is_file() {
        bail!(
            "the vmop binary {} does not exist: build it with `cargo build -p vmop --bin vmop` \
             (scripts/demo.sh does) or pass --vmop",
            path.display()
        );
    }
    Ok(path)
}

/// A loopback address with a port free right now, for the operator's metrics server.
fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .context("failed to find a free loopback port")
}

/// SIGINT and SIGTERM, both handled from the moment [`Signals::new`] returns.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("failed to handle SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("failed to handle SIGTERM")?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
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
