//! Kubeconfig files for the test control plane, readable by kubectl and kube-rs alike.
//!
//! They are written as JSON (a subset of YAML) and refer to certificate files by path, so they
//! are valid as long as the control plane's directory exists.

use std::io;
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const CLUSTER: &str = "vmop-test";

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("failed to write kubeconfig {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read kubeconfig {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("failed to build a client from kubeconfig {path}")]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
}

/// How a kubeconfig user authenticates.
#[derive(Debug, Clone, Copy)]
pub enum Credentials<'a> {
    /// A client certificate and its key, both PEM files.
    ClientCert { cert: &'a Path, key: &'a Path },
    /// A bearer token, e.g. a ServiceAccount token from the TokenRequest API.
    Token(&'a str),
}

/// Writes a kubeconfig for `user` at `path` pointing to `server`, trusting the CA in `ca_cert`.
pub fn write(
    path: &Path,
    server: &str,
    ca_cert: &Path,
    user: &str,
    credentials: Credentials<'_>,
) -> Result<(), KubeconfigError> {
    let user_entry = match credentials {
        Credentials::ClientCert { cert, key } => json!({
            "client-certificate": cert,
            "client-key": key,
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let document = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": CLUSTER,
            "cluster": { "server": server, "certificate-authority": ca_cert },
        }],
        "users": [{ "name": user, "user": user_entry }],
        "contexts": [{
            "name": user,
            "context": { "cluster": CLUSTER, "user": user, "namespace": "default" },
        }],
        "current-context": user,
    });
    let text = serde_json::to_string_pretty(&document).map_err(io::Error::other);
    text.and_then(|text| std::fs::write(path, text))
        .map_err(|source| KubeconfigError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// The client configuration of a kubeconfig file's current context.
pub async fn config(path: &Path) -> Result<kube::Config, KubeconfigError> {
    let read_error = |source| KubeconfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(read_error)?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(read_error)
}

/// A client for a kubeconfig file's current context. Tied to the calling tokio runtime.
pub async fn client(path: &Path) -> Result<kube::Client, KubeconfigError> {
    let config = config(path).await?;
    kube::Client::try_from(config).map_err(|source| KubeconfigError::Client {
        path: path.to_path_buf(),
        source,
    })
}
