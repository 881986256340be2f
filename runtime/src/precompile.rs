//! Where a plugin is compiled: in this process ([`Compiler::InProcess`], the default), or in a
//! child process running this binary's hidden `vmop precompile` ([`Compiler::Child`], what
//! `vmop run` uses), which reads the component on stdin and writes wasmtime's artifact on
//! stdout for this process to map.
//!
//! # Why a child
//!
//! Compiling runs Cranelift: its code (megabytes of the binary's text) is paged in, and its
//! working memory (tens of MiB for a Rust plugin, about 400 MB for a Python or JavaScript one)
//! goes back to the allocator, which keeps much of it. In the operator's own process both stay
//! resident for the process's lifetime. `bench/run.sh` (N=1000, a fresh plugin cache per run)
//! measured the operator's peak RSS at 48.3 MiB compiling the testcloud plugin in-process and
//! 31.7–31.9 MiB with the child; with the Python testcloud plugin (N=200) 453–460 MiB against
//! 190 MiB, and 370–374 MiB against 97–99 MiB at the end of a phase. A child gives all of it
//! back when it exits. The memory budget is unchanged (`EngineConfig::memory_budget` still
//! counts one compilation: the child runs in the operator's container), but it is spent once
//! per plugin digest, not kept.
//!
//! A child that dies (the kernel's OOM killer picks the largest process of the container: the
//! compiler) fails that plugin's load with [`CompileError::Killed`]; the operator keeps serving
//! every other plugin (`tests::a_killed_child_fails_the_load_and_compiles_nothing_here`). A
//! child that cannot be started, or whose artifact this engine refuses (another wasmtime build
//! behind `/proc/self/exe`), is not a plugin's fault: the component is compiled in this process
//! instead, with a warning (`tests::a_child_that_cannot_start_leaves_the_compile_to_this_process`,
//! `tests::an_artifact_this_engine_refuses_leaves_the_compile_to_this_process`). A child that
//! has not answered by its deadline is killed and the load fails with
//! [`CompileError::TimedOut`]: a plugin that makes the compiler spin cannot hold the one
//! compilation slot, and every other plugin's load behind it, for longer
//! (`tests::a_child_past_its_deadline_is_killed`). That `vmop run`
//! compiles in a child is checked on the real operator by `tests/tests/operator/cache_restart.rs`.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::engine::{WasmError, on_demand_engine};

/// The hidden subcommand a [`Compiler::Child`] runs.
pub const SUBCOMMAND: &str = "precompile";
/// The largest artifact accepted from a child (this binary: its output is read whole, then
/// checked): a compiled Python or JavaScript plugin is about 100 MB, and the disk cache keeps
/// 192 MiB in all.
pub const MAX_ARTIFACT_BYTES: usize = 512 << 20;
/// How much of a failed child's stderr becomes the error message.
const MAX_MESSAGE_BYTES: usize = 4 << 10;
/// How long a child may take: a Python or JavaScript plugin compiles in seconds on one core.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(300);
/// How often a running child is looked at for its exit or its deadline.
const CHILD_POLL: Duration = Duration::from_millis(20);

/// Where components are compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Compiler {
    /// With this process's engine, on the calling (blocking) thread.
    #[default]
    InProcess,
    /// `exe precompile` in a child process; `exe` is this binary (`/proc/self/exe`), killed
    /// past `deadline` ([`CHILD_DEADLINE`] for `vmop run`).
    Child { exe: PathBuf, deadline: Duration },
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("the component does not compile")]
    Invalid(#[source] WasmError),
    #[error("the compiler process refused the component: {0}")]
    Refused(String),
    #[error("the compiler process ended without an artifact ({0}): killed for memory or time?")]
    Killed(ExitStatus),
    #[error("the compiler process wrote more than {MAX_ARTIFACT_BYTES} bytes")]
    TooLarge,
    #[error("the compiler process did not finish within {0:?} and was killed")]
    TimedOut(Duration),
}

/// Why a child gave no usable artifact although the component may be fine.
#[derive(Debug, thiserror::Error)]
enum ChildUnavailable {
    #[error("could not run {exe}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("this engine refuses the child's artifact")]
    Incompatible(#[source] WasmError),
}

/// A compiled component, and where it was compiled.
#[derive(Debug)]
pub struct Compiled {
    pub component: Component,
    /// `false` also when a [`Compiler::Child`] fell back to this process.
    pub in_child: bool,
}

impl Compiler {
    /// Compiles `wasm` for `engine`. Runs on a blocking thread.
    pub fn compile(&self, engine: &Engine, wasm: &[u8]) -> Result<Compiled, CompileError> {
        let Compiler::Child { exe, deadline } = self else {
            return in_process(engine, wasm);
        };
        match in_child(exe, *deadline, engine, wasm) {
            Ok(outcome) => outcome.map(|component| Compiled {
                component,
                in_child: true,
            }),
            Err(e) => {
                tracing::warn!(error = %e, source = ?std::error::Error::source(&e), "compiling the plugin in this process instead of a child");
                in_process(engine, wasm)
            }
        }
    }
}

fn in_process(engine: &Engine, wasm: &[u8]) -> Result<Compiled, CompileError> {
    Component::new(engine, wasm)
        .map(|component| Compiled {
            component,
            in_child: false,
        })
        .map_err(|e| CompileError::Invalid(e.into()))
}

/// The child's outcome for the component, or why there is none to judge it by.
fn in_child(
    exe: &Path,
    deadline: Duration,
    engine: &Engine,
    wasm: &[u8],
) -> Result<Result<Component, CompileError>, ChildUnavailable> {
    let spawn = |source| ChildUnavailable::Spawn {
        exe: exe.to_path_buf(),
        source,
    };
    let mut child = Command::new(exe)
        .arg(SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A child that exits before reading everything says why on stderr: read that below.
        match stdin.write_all(wasm) {
            Err(e) if e.kind() != io::ErrorKind::BrokenPipe => return Err(spawn(e)),
            _ => {}
        }
    }
    let Some(output) = wait_until(child, deadline).map_err(spawn)? else {
        return Ok(Err(CompileError::TimedOut(deadline)));
    };
    if !output.status.success() {
        return Ok(Err(match output.status.code() {
            Some(_) => CompileError::Refused(message(&output.stderr)),
            None => CompileError::Killed(output.status),
        }));
    }
    if output.stdout.len() > MAX_ARTIFACT_BYTES {
        return Ok(Err(CompileError::TooLarge));
    }
    deserialize(engine, &output.stdout)
        .map(Ok)
        .map_err(|e| ChildUnavailable::Incompatible(e.into()))
}

/// What a child wrote and how it ended, or `None` when it was still running at `deadline`
/// (then it is killed and reaped). Its pipes are read on threads of their own, so a child that
/// fills one never blocks.
fn wait_until(mut child: Child, deadline: Duration) -> io::Result<Option<std::process::Output>> {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                // A read error ends what the child said; its exit status tells the rest.
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() >= deadline {
            child.kill()?;
            child.wait()?;
            break None;
        }
        thread::sleep(CHILD_POLL);
    };
    let (stdout, stderr) = (stdout.join(), stderr.join());
    Ok(status.map(|status| std::process::Output {
        status,
        stdout: stdout.unwrap_or_default(),
        stderr: stderr.unwrap_or_default(),
    }))
}

/// The last line of a failed child's stderr (its `Error: …`), bounded.
fn message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    vmop_contract::text::cut(last, MAX_MESSAGE_BYTES).to_owned()
}

/// Deserializes what a [`Compiler::Child`] wrote on its stdout.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: the bytes are wasmtime's own artifact, written by this very executable
    // (`/proc/self/exe`) into a pipe only this process reads; wasmtime checks the version and
    // engine settings recorded in them against `engine` before using anything.
    unsafe { Component::deserialize(engine, bytes) }
}

/// The child's side (`vmop precompile`): the component on `input`, the artifact for an engine
/// configured like the operator's on `output`.
pub fn serve(mut input: impl Read, mut output: impl Write) -> Result<(), PrecompileError> {
    let mut wasm = Vec::new();
    input.read_to_end(&mut wasm).map_err(PrecompileError::Io)?;
    let engine = on_demand_engine().map_err(PrecompileError::Engine)?;
    let artifact = engine
        .precompile_component(&wasm)
        .map_err(|e| PrecompileError::Compile(format!("{e:#}")))?;
    drop(wasm);
    output.write_all(&artifact).map_err(PrecompileError::Io)?;
    output.flush().map_err(PrecompileError::Io)
}

#[derive(Debug, thiserror::Error)]
pub enum PrecompileError {
    #[error("failed to create the engine")]
    Engine(#[source] super::engine::EngineError),
    /// wasmtime's error chain on one line: the parent reports the last line of stderr.
    #[error("the component does not compile: {0}")]
    Compile(String),
    #[error("failed to read the component or write the artifact")]
    Io(#[source] io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(component)` in the binary format.
    const EMPTY_COMPONENT: &[u8] = &[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    fn engine() -> Engine {
        on_demand_engine().unwrap()
    }

    /// A stand-in for `vmop precompile`: a shell script with `body`, in a directory that lives
    /// as long as the returned guard.
    fn child(body: &str) -> (tempfile::TempDir, Compiler) {
        child_with(body, Duration::from_secs(60))
    }

    /// [`child`], killed past `deadline`.
    fn child_with(body: &str, deadline: Duration) -> (tempfile::TempDir, Compiler) {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("child");
        std::fs::write(&exe, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        (dir, Compiler::Child { exe, deadline })
    }

    #[test]
    fn a_child_that_cannot_start_leaves_the_compile_to_this_process() {
        let compiler = Compiler::Child {
            exe: PathBuf::from("/nonexistent/vmop"),
            deadline: CHILD_DEADLINE,
        };
        let compiled = compiler.compile(&engine(), EMPTY_COMPONENT).unwrap();
        assert!(!compiled.in_child);
    }

    #[test]
    fn a_childs_refusal_is_the_components_error_with_its_last_stderr_line() {
        let (_dir, compiler) = child("echo noise >&2\necho 'Error: not a component' >&2\nexit 1\n");
        let err = compiler.compile(&engine(), EMPTY_COMPONENT).unwrap_err();
        assert!(
            matches!(&err, CompileError::Refused(m) if m == "Error: not a component"),
            "{err:?}"
        );
    }

    #[test]
    fn a_killed_child_fails_the_load_and_compiles_nothing_here() {
        let (_dir, compiler) = child("kill -9 $$\n");
        let err = compiler.compile(&engine(), EMPTY_COMPONENT).unwrap_err();
        assert!(matches!(err, CompileError::Killed(_)), "{err:?}");
    }

    #[test]
    fn a_child_past_its_deadline_is_killed() {
        let deadline = Duration::from_millis(200);
        let (_dir, compiler) = child_with("cat >/dev/null\nexec sleep 600\n", deadline);
        let err = compiler.compile(&engine(), EMPTY_COMPONENT).unwrap_err();
        assert!(
            matches!(err, CompileError::TimedOut(d) if d == deadline),
            "{err:?}"
        );
    }

    #[test]
    fn an_artifact_this_engine_refuses_leaves_the_compile_to_this_process() {
        let (_dir, compiler) = child("cat >/dev/null\necho not-an-artifact\n");
        let compiled = compiler.compile(&engine(), EMPTY_COMPONENT).unwrap();
        assert!(!compiled.in_child);
    }

    #[test]
    fn what_serve_writes_deserializes_into_the_operators_pooling_engine() {
        let mut artifact = Vec::new();
        serve(EMPTY_COMPONENT, &mut artifact).unwrap();
        let pooling = crate::engine::PluginEngine::new(&Default::default()).unwrap();
        assert!(pooling.is_pooling(), "the test machine supports pooling");
        deserialize(pooling.engine(), &artifact).unwrap();
    }

    #[test]
    fn a_long_message_is_cut_on_a_char_boundary() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let m = message(long.as_bytes());
        assert!(m.len() <= MAX_MESSAGE_BYTES && m.chars().all(|c| c == 'é'));
    }
}
