//! A real EC2 API for tests: moto's server (`pip install 'moto[server]'`) on a free loopback
//! port, one per [`Moto`], killed when dropped.
//!
//! The binary is `$VMOP_MOTO_SERVER`, else `moto_server` on `PATH`. By default moto accepts any
//! credentials; [`Moto::start_with_auth`] makes it check SigV4 signatures and IAM permissions
//! for real (see `shared/notes/moto.md`).
//!
//! The requests the harness sends itself ([`Moto::ec2`], the IAM setup) are not signed for
//! real: they work only while moto does not authenticate.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

mod wire;

pub const MOTO_SERVER_ENV: &str = "VMOP_MOTO_SERVER";

/// How long moto may take to answer after it was started (it starts in under a second here).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a port taken between probe and bind is retried with a new one.
const BIND_ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum MotoError {
    #[error(
        "moto_server was not found: set {MOTO_SERVER_ENV} to its path or put it on PATH \
         (install it with `pip install 'moto[server]'`)"
    )]
    NotInstalled,
    #[error("failed to find a free loopback port")]
    Port(#[source] io::Error),
    #[error("failed to create moto's log file")]
    Log(#[source] io::Error),
    #[error("failed to start {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("moto_server exited before answering ({status}); the end of its log:\n{log}")]
    Exited { status: ExitStatus, log: String },
    #[error(
        "moto_server did not answer on port {port} within {timeout:?}; the end of its log:\n{log}"
    )]
    NotReady {
        port: u16,
        timeout: Duration,
        log: String,
    },
    #[error("request {action} to moto failed")]
    Request {
        action: String,
        #[source]
        source: io::Error,
    },
    #[error("moto answered {action} with HTTP {status}: {body}")]
    Status {
        action: String,
        status: u16,
        body: String,
    },
    #[error("moto's answer to {action} has no <{element}>: {body}")]
    Missing {
        action: String,
        element: &'static str,
        body: String,
    },
}

/// AWS credentials moto issued. `Debug` hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// A running moto server.
#[derive(Debug)]
pub struct Moto {
    child: Mutex<Child>,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl Moto {
    /// Starts moto accepting any credentials.
    pub fn start() -> Result<Moto, MotoError> {
        Self::spawn(None)
    }

    /// Starts moto in IAM-authentication mode: an IAM user with an inline `ec2:*` policy and an
    /// access key are created, then every request (EC2 included) must be signed with that key
    /// and be allowed by its policy. Returns the working credentials.
    pub fn start_with_auth() -> Result<(Moto, AwsCredentials), MotoError> {
        // Exactly the three IAM calls below pass unauthenticated.
        let moto = Self::spawn(Some(3))?;
        let user = "vmop-test";
        moto.iam("CreateUser", &[("UserName", user)])?;
        let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ec2:*","Resource":"*"}]}"#;
        moto.iam(
            "PutUserPolicy",
            &[
                ("UserName", user),
                ("PolicyName", "ec2-all"),
                ("PolicyDocument", policy),
            ],
        )?;
        let body = moto.iam("CreateAccessKey", &[("UserName", user)])?;
        let element = |element| {
            wire::first_element(&body, element).ok_or_else(|| MotoError::Missing {
                action: "CreateAccessKey".to_owned(),
                element,
                body: body.clone(),
            })
        };
        let credentials = AwsCredentials {
            access_key_id: element("AccessKeyId")?,
            secret_access_key: element("SecretAccessKey")?,
        };
        Ok((moto, credentials))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`: the EC2 endpoint and the egress allowlist entry.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log_path(&self) -> &Path {
        self.log.path()
    }

    /// Ids of every instance (in any state) carrying tag `key` = `value`, sorted and unique.
    /// Only meaningful while moto does not authenticate.
    pub fn instance_ids_with_tag(&self, key: &str, value: &str) -> Result<Vec<String>, MotoError> {
        let tag = format!("tag:{key}");
        let body = self.ec2(
            "DescribeInstances",
            &[("Filter.1.Name", tag.as_str()), ("Filter.1.Value.1", value)],
        )?;
        let mut ids = wire::all_elements(&body, "instanceId");
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// The state name (`running`, `terminated`, ...) of instance `id`, if moto knows it.
    pub fn instance_state(&self, id: &str) -> Result<Option<String>, MotoError> {
        match self.ec2("DescribeInstances", &[("InstanceId.1", id)]) {
            Ok(body) => Ok(wire::element_after(&body, "instanceState", "name")),
            Err(MotoError::Status { body, .. }) if body.contains("InvalidInstanceID.NotFound") => {
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// One EC2 Query API action; the XML body of a 2xx answer.
    pub fn ec2(&self, action: &str, params: &[(&str, &str)]) -> Result<String, MotoError> {
        self.query("ec2", "2016-11-15", action, params)
    }

    fn iam(&self, action: &str, params: &[(&str, &str)]) -> Result<String, MotoError> {
        self.query("iam", "2010-05-08", action, params)
    }

    fn query(
        &self,
        service: &str,
        version: &str,
        action: &str,
        params: &[(&str, &str)],
    ) -> Result<String, MotoError> {
        let request = wire::query_request(self.port, service, version, action, params);
        let (status, body) =
            wire::exchange(self.port, &request).map_err(|source| MotoError::Request {
                action: action.to_owned(),
                source,
            })?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(MotoError::Status {
                action: action.to_owned(),
                status,
                body,
            })
        }
    }

    fn spawn(no_auth_count: Option<u32>) -> Result<Moto, MotoError> {
        let program = moto_server()?;
        let mut last_error = None;
        for _ in 0..BIND_ATTEMPTS {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map_err(MotoError::Port)?
                .port();
            let log = tempfile::Builder::new()
                .prefix("moto-")
                .suffix(".log")
                .tempfile()
                .map_err(MotoError::Log)?;
            let stdout = log.reopen().map_err(MotoError::Log)?;
            let stderr = log.reopen().map_err(MotoError::Log)?;
            let mut command = Command::new(&program);
            command
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr);
            if let Some(count) = no_auth_count {
                command.env("INITIAL_NO_AUTH_ACTION_COUNT", count.to_string());
            }
            crate::child::die_with_parent(&mut command, crate::child::Group::Inherit);
            let child = command.spawn().map_err(|source| MotoError::Spawn {
                program: program.clone(),
                source,
            })?;
            let moto = Moto {
                child: Mutex::new(child),
                port,
                log,
            };
            match moto.wait_ready() {
                Ok(()) => return Ok(moto),
                Err(err @ MotoError::Exited { .. }) if is_bind_failure(&err) => {
                    last_error = Some(err)
                }
                Err(err) => return Err(err),
            }
        }
        Err(last_error.unwrap_or(MotoError::NotInstalled))
    }

    /// Polls until moto answers HTTP, it exits, or [`START_TIMEOUT`] passes.
    fn wait_ready(&self) -> Result<(), MotoError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let probe = format!(
            "GET /moto-api/reset-auth HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.port
        );
        loop {
            if wire::exchange(self.port, &probe).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.lock().try_wait() {
                return Err(MotoError::Exited {
                    status,
                    log: self.log_tail(),
                });
            }
            if Instant::now() >= deadline {
                return Err(MotoError::NotReady {
                    port: self.port,
                    timeout: START_TIMEOUT,
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read(self.log.path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let start = text.char_indices().rev().nth(4000).map_or(0, |(i, _)| i);
        text.get(start..).unwrap_or_default().to_owned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let mut child = self.lock();
        if let Ok(None) = child.try_wait() {
            // An error means it already exited.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn is_bind_failure(err: &MotoError) -> bool {
    matches!(err, MotoError::Exited { log, .. } if log.contains("Address already in use"))
}

fn moto_server() -> Result<PathBuf, MotoError> {
    if let Some(path) = std::env::var_os(MOTO_SERVER_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(MotoError::NotInstalled)
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("moto_server"))
        .find(|candidate| candidate.is_file())
        .ok_or(MotoError::NotInstalled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_debug_hides_the_secret() {
        let c = AwsCredentials {
            access_key_id: "AKIA1".into(),
            secret_access_key: "s3cr3t".into(),
        };
        let debug = format!("{c:?}");
        assert!(
            debug.contains("AKIA1") && !debug.contains("s3cr3t"),
            "{debug}"
        );
    }
}
