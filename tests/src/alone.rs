//! One test in a process of its own, for a test that measures the whole process (its peak
//! resident set): the test binary runs that test again in a child, filtered to it alone, so
//! that no other test of the binary runs next to the measurement.

use std::process::Command;

use anyhow::{Context as _, ensure};

/// Set in the child to the name of the test it runs alone.
const ALONE_ENV: &str = "VMOP_TESTS_ALONE";

/// Runs test `function` of `module` (the caller's `module_path!()`) in a child process of
/// this test binary where it is the only test. Returns `true` in that child: the caller goes on
/// and does its work there. Returns `false` in the parent once the child passed (its output
/// goes to this test's output); fails with the child's output if it did not.
pub fn in_own_process(module: &str, function: &str) -> anyhow::Result<bool> {
    // libtest names a test by its path inside the crate: without the crate's own name.
    let name = match module.split_once("::") {
        Some((_, path)) => format!("{path}::{function}"),
        None => function.to_owned(),
    };
    if std::env::var_os(ALONE_ENV).is_some_and(|alone| alone == name.as_str()) {
        return Ok(true);
    }
    let binary = std::env::current_exe().context("failed to locate this test binary")?;
    let output = Command::new(&binary)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE_ENV, &name)
        .output()
        .with_context(|| format!("failed to run {} alone", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "{name}, alone in process {}:\n{stdout}{stderr}",
        binary.display()
    );
    ensure!(
        output.status.success(),
        "{name} failed in its own process ({})",
        output.status
    );
    // A filter that matches nothing passes too: make sure the test ran.
    ensure!(
        stdout.contains("test result: ok. 1 passed"),
        "{name} did not run in its own process"
    );
    Ok(false)
}
