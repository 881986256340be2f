//! Child processes of the control plane: spawned with their output in a log file, killed when
//! dropped, and killed by the kernel when this process dies.
//!
//! Statics are never dropped, so the shared control plane relies on `PR_SET_PDEATHSIG`. That
//! signal fires when the *thread* that forked the child exits, not the process: every child is
//! therefore forked by one dedicated thread that lives as long as the process.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};

/// How much of the end of a log an error message quotes.
const LOG_TAIL_BYTES: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("failed to create log file {path}")]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to start {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the process-spawning thread is gone")]
    SpawnerGone,
}

/// A running child whose stdout and stderr go to a log file. Killed (and reaped) on drop.
#[derive(Debug)]
pub struct Process {
    child: Mutex<Child>,
    program: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, writing its output to `log`.
    pub fn spawn(program: &Path, args: Vec<OsString>, log: PathBuf) -> Result<Self, ProcessError> {
        let file = File::create(&log).map_err(|source| ProcessError::Log {
            path: log.clone(),
            source,
        })?;
        let child = start(program, &args, &log, file)?;
        Ok(Self {
            child: Mutex::new(child),
            program: program.to_path_buf(),
            args,
            log,
        })
    }

    /// Kills the process (SIGKILL, as a crash would) and starts the same command again, its
    /// output appended to the same log. The new process has a new pid.
    pub fn respawn(&self) -> Result<(), ProcessError> {
        let mut child = self.lock();
        if let Ok(None) = child.try_wait() {
            // Errors mean it already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
        let file = File::options()
            .append(true)
            .create(true)
            .open(&self.log)
            .map_err(|source| ProcessError::Log {
                path: self.log.clone(),
                source,
            })?;
        *child = start(&self.program, &self.args, &self.log, file)?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.lock().id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status if the process has ended, without blocking.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.lock().try_wait().ok().flatten()
    }

    /// The last few kilobytes of the log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Kills the process and reaps it. Idempotent.
    pub fn kill(&self) {
        let mut child = self.lock();
        if let Ok(None) = child.try_wait() {
            // Errors mean it already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `program` with `args`, its stdout and stderr going to `file` (the log at `log`).
fn start(program: &Path, args: &[OsString], log: &Path, file: File) -> Result<Child, ProcessError> {
    let stderr = file.try_clone().map_err(|source| ProcessError::Log {
        path: log.to_path_buf(),
        source,
    })?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr);
    crate::child::die_with_parent(&mut command, crate::child::Group::Inherit);
    spawn_on_keeper_thread(command).and_then(|spawned| {
        spawned.map_err(|source| ProcessError::Spawn {
            program: program.to_path_buf(),
            source,
        })
    })
}

/// The end of a log file, lossily decoded; a note instead if it cannot be read.
pub fn log_tail(path: &Path) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_else(|error| format!("<cannot read {}: {error}>", path.display()))
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Forks `command` on the keeper thread, which never exits while the process lives.
fn spawn_on_keeper_thread(command: Command) -> Result<io::Result<Child>, ProcessError> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot be created, `incoming` is dropped and every send below fails.
        let _ = std::thread::Builder::new()
            .name("controlplane-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            });
        Mutex::new(requests)
    });
    let (reply, answer) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, reply))
        .map_err(|_| ProcessError::SpawnerGone)?;
    answer.recv().map_err(|_| ProcessError::SpawnerGone)
}
