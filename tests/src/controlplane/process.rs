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
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, writing its output to `log`.
    pub fn spawn(program: &Path, args: Vec<OsString>, log: PathBuf) -> Result<Self, ProcessError> {
        let log_error = |source| ProcessError::Log {
            path: log.clone(),
            source,
        };
        let stdout = File::create(&log).map_err(log_error)?;
        let stderr = stdout.try_clone().map_err(log_error)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        crate::child::die_with_parent(&mut command, crate::child::Group::Inherit);
        let child = spawn_on_keeper_thread(command).and_then(|spawned| {
            spawned.map_err(|source| ProcessError::Spawn {
                program: program.to_path_buf(),
                source,
            })
        })?;
        Ok(Self {
            child: Mutex::new(child),
            log,
        })
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
