//! The README's demo (`scripts/demo.sh` runs the `demo` binary): with `--exit-when-ready` it
//! brings up the control plane, moto and the operator, lists three Running VMs with their EC2
//! instance ids, then stops everything it started.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, ensure};

/// The value printed after `label` on a line of the demo's summary (`  API server  https://..`).
fn summary_value<'a>(stdout: &'a str, label: &str) -> anyhow::Result<&'a str> {
    stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("the summary has no `{label}` line:\n{stdout}"))
}

/// Whether something accepts TCP connections at the `host:port` of `url`.
fn answers(url: &str) -> anyhow::Result<bool> {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme.split('/').next().unwrap_or(after_scheme);
    let addr = authority
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("{url} names no address"))?;
    Ok(TcpStream::connect(addr).is_ok())
}

#[test]
fn demo_shows_three_running_vms_and_leaves_nothing_running() -> anyhow::Result<()> {
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--exit-when-ready")
        .args(["--vmop", env!("CARGO_BIN_EXE_vmop-operator")])
        .output()
        .context("failed to run the demo")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );

    // The `kubectl get vm -A -o wide` table: NAMESPACE NAME PHASE ID PROVIDER AGE.
    let header = stdout
        .lines()
        .find(|line| line.starts_with("NAMESPACE"))
        .context("no kubectl table in the output")?;
    assert_eq!(
        header.split_whitespace().take(5).collect::<Vec<_>>(),
        ["NAMESPACE", "NAME", "PHASE", "ID", "PROVIDER"],
        "{stdout}"
    );
    for name in ["web-1", "web-2", "db-1"] {
        let row = stdout
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|fields| fields.first() == Some(&"demo") && fields.get(1) == Some(&name))
            .with_context(|| format!("no row for demo/{name} in:\n{stdout}"))?;
        assert_eq!(row[2], "Running", "{name}: {row:?}");
        assert!(
            row[3].starts_with("i-") && row[3].len() > 2,
            "{name} has no EC2 instance id: {row:?}"
        );
    }

    // Everything it started is gone (`answers` does see a listener: checked first): nothing answers where the API server and moto listened,
    // no process it reported is alive, and its files are removed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    assert!(answers(&format!(
        "http://{}/metrics",
        listener.local_addr()?
    ))?);
    drop(listener);
    for label in ["API server", "EC2 API (moto)", "metrics"] {
        let url = summary_value(&stdout, label)?;
        assert!(!answers(url)?, "{label} still answers at {url}");
    }
    for label in ["kubeconfig", "demo files"] {
        let path = summary_value(&stdout, label)?;
        assert!(!Path::new(path).exists(), "{label} {path} was left behind");
    }
    let stopped = stderr
        .lines()
        .find(|line| line.starts_with("demo: stopped the operator"))
        .with_context(|| format!("the demo did not report stopping:\n{stderr}"))?;
    let pids: Vec<&str> = stopped
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(
        pids.len() >= 3,
        "expected the operator's and control plane's pids: {stopped}"
    );
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} is still running: {stopped}"
        );
    }
    Ok(())
}
