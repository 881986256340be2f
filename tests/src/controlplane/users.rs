//! Identities besides the admin: client-certificate users and bearer-token kubeconfigs.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::kubeconfig::{self, Credentials};
use super::{ControlPlane, ControlPlaneError};

impl ControlPlane {
    /// Writes a kubeconfig for user `name` in `groups` (at most one group besides the
    /// implicit `system:authenticated`), authenticated by a client certificate.
    pub fn user_kubeconfig(
        &self,
        name: &str,
        groups: &[&str],
    ) -> Result<PathBuf, ControlPlaneError> {
        let stem = self.user_file_stem(name);
        let files = self
            .pki
            .client_cert(name, groups, &stem)
            .map_err(ControlPlaneError::Pki)?;
        let credentials = Credentials::ClientCert {
            cert: &files.cert,
            key: &files.key,
        };
        self.write_user_kubeconfig(&stem, name, credentials)
    }

    /// Writes a kubeconfig that authenticates with a bearer `token` (e.g. a ServiceAccount
    /// token from the TokenRequest API); `name` only labels the kubeconfig entries.
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf, ControlPlaneError> {
        let stem = self.user_file_stem(name);
        self.write_user_kubeconfig(&stem, name, Credentials::Token(token))
    }

    /// A client for any kubeconfig, e.g. one from [`Self::user_kubeconfig`].
    pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client, ControlPlaneError> {
        kubeconfig::client(kubeconfig)
            .await
            .map_err(ControlPlaneError::Kubeconfig)
    }

    fn user_file_stem(&self, name: &str) -> String {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{safe}-{}", self.next_user.fetch_add(1, Ordering::Relaxed))
    }

    fn write_user_kubeconfig(
        &self,
        stem: &str,
        name: &str,
        credentials: Credentials<'_>,
    ) -> Result<PathBuf, ControlPlaneError> {
        let path = self.users_dir.join(format!("{stem}.kubeconfig"));
        kubeconfig::write(
            &path,
            &self.server_url,
            &self.pki.ca_cert,
            name,
            credentials,
        )
        .map_err(ControlPlaneError::Kubeconfig)?;
        Ok(path)
    }
}
