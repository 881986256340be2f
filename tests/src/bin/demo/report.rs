//! What the demo prints on stdout once the machines are Running: the `kubectl get vm` table, how
//! to use the cluster, and where everything listens.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context as _;
use vmop_tests::controlplane::ControlPlane;

use crate::objects::{DEMO_NAMESPACE, PROVIDER_CONFIG};

/// An `Authorization` header that only routes a request to moto's EC2 service: moto accepts any
/// signature unless it was started to authenticate, which the demo does not do.
const MOTO_EC2_ROUTING: &str =
    "Authorization: AWS4-HMAC-SHA256 Credential=demo/20260101/us-east-1/ec2/aws4_request";

#[derive(Debug)]
pub struct Summary<'a> {
    /// The output of `kubectl get vm -A -o wide`.
    pub table: &'a str,
    pub control_plane: &'a ControlPlane,
    pub moto_endpoint: &'a str,
    /// Where the operator's log is (a file to tail, or the kubectl command).
    pub operator_log: &'a str,
    pub metrics_addr: SocketAddr,
    pub dir: &'a Path,
    /// False with `--exit-when-ready`: the demo stops right after printing.
    pub waits_for_signal: bool,
}

/// Writes the summary to stdout in one piece.
pub fn print(summary: &Summary<'_>) -> anyhow::Result<()> {
    let text = render(summary)?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("failed to write the summary to stdout")
}

fn render(s: &Summary<'_>) -> Result<String, std::fmt::Error> {
    let kubeconfig = s.control_plane.kubeconfig().display();
    let bin_dir = s.control_plane.binaries().dir().display();
    let moto = s.moto_endpoint;
    let ns = DEMO_NAMESPACE;
    let describe_instances = format!(
        "curl -s {moto}/ -H '{MOTO_EC2_ROUTING}' -d Action=DescribeInstances \
         -d Version=2016-11-15 | grep -oE '<(instanceId|name)>[^<]+' | sed 's/<[^>]*>//' \
         | paste - -"
    );
    let mut out = String::new();
    writeln!(out)?;
    writeln!(
        out,
        "vmop is running: three VirtualMachines are Running on moto's EC2 API, created through \
         the ec2 WebAssembly plugin."
    )?;
    writeln!(out)?;
    writeln!(out, "$ kubectl get vm -A -o wide")?;
    write!(out, "{}", s.table)?;
    writeln!(out)?;
    writeln!(out, "Use the cluster (from another terminal):")?;
    writeln!(out, "  export KUBECONFIG={kubeconfig}")?;
    writeln!(
        out,
        "  export PATH={bin_dir}:$PATH   # kubectl, built with the control plane"
    )?;
    writeln!(out, "  kubectl get vm -n {ns}")?;
    writeln!(out, "  kubectl describe vm web-1 -n {ns}")?;
    writeln!(
        out,
        "  kubectl get configmap web-1-connection -n {ns} -o yaml   # id, phase, addresses"
    )?;
    writeln!(
        out,
        "  kubectl get providerconfig {PROVIDER_CONFIG} -o yaml"
    )?;
    writeln!(
        out,
        "  kubectl delete vm db-1 -n {ns}   # the operator terminates its instance; moto shows it:"
    )?;
    writeln!(out, "  {describe_instances}")?;
    writeln!(out)?;
    writeln!(out, "Where things are:")?;
    writeln!(out, "  API server      {}", s.control_plane.server_url())?;
    writeln!(out, "  kubeconfig      {kubeconfig}")?;
    writeln!(out, "  EC2 API (moto)  {moto}")?;
    writeln!(out, "  operator log    {}", s.operator_log)?;
    writeln!(out, "  metrics         http://{}/metrics", s.metrics_addr)?;
    writeln!(out, "  demo files      {}", s.dir.display())?;
    writeln!(out)?;
    if s.waits_for_signal {
        writeln!(out, "Press Ctrl-C to stop everything.")?;
    } else {
        writeln!(out, "--exit-when-ready: stopping everything now.")?;
    }
    Ok(out)
}
