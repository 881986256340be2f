//! Certificates and keys of a test control plane: one CA that signs the apiserver's serving
//! certificate and every client certificate, and the service-account token signing key.
//!
//! Everything is ECDSA P-256 (rcgen's default), which Go, rustls and the service-account
//! token signer (ES256) all accept.

use std::io;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("failed to generate the {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error(
        "client certificates carry at most one group (rcgen encodes one O per name), got {0:?}"
    )]
    TooManyGroups(Vec<String>),
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Paths of a certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA and the files the apiserver needs, written under one directory.
pub struct Pki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
    pub ca_cert: PathBuf,
    pub serving: CertFiles,
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// Generates the CA, the serving certificate (127.0.0.1, localhost) and the service-account
    /// key pair, writing them to `dir` (which must exist).
    pub fn generate(dir: &Path) -> Result<Self, PkiError> {
        let ca_key = generate_key("CA key")?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("vmop-test-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_pem = ca_params
            .self_signed(&ca_key)
            .map_err(|source| PkiError::Generate {
                what: "CA certificate",
                source,
            })?
            .pem();
        let ca_cert = dir.join("ca.crt");
        write(&ca_cert, &ca_pem)?;
        let ca = Issuer::new(ca_params, ca_key);

        let mut serving_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).map_err(
                |source| PkiError::Generate {
                    what: "serving certificate parameters",
                    source,
                },
            )?;
        serving_params.distinguished_name = name("kube-apiserver", None);
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let serving = issue(&ca, serving_params, dir, "serving")?;

        let sa_key = generate_key("service-account signing key")?;
        let service_account_key = dir.join("service-account.key");
        let service_account_pub = dir.join("service-account.pub");
        write(&service_account_key, &sa_key.serialize_pem())?;
        write(&service_account_pub, &sa_key.public_key_pem())?;

        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
            ca_pem,
            ca_cert,
            serving,
            service_account_key,
            service_account_pub,
        })
    }

    /// The CA certificate in PEM: trust it to reach the apiserver; it also signs client
    /// certificates the apiserver accepts.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Issues a client certificate for user `common_name` in `groups` (the apiserver maps CN to
    /// the user name and O to a group; `system:authenticated` is added by the apiserver), written
    /// as `<file_stem>.crt` / `.key` in the PKI dir. At most one group.
    pub fn client_cert(
        &self,
        common_name: &str,
        groups: &[&str],
        file_stem: &str,
    ) -> Result<CertFiles, PkiError> {
        if groups.len() > 1 {
            return Err(PkiError::TooManyGroups(
                groups.iter().map(|g| (*g).to_owned()).collect(),
            ));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, groups.first().copied());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        issue(&self.ca, params, &self.dir, file_stem)
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}

fn generate_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate().map_err(|source| PkiError::Generate { what, source })
}

fn issue(
    ca: &Issuer<'static, KeyPair>,
    params: CertificateParams,
    dir: &Path,
    file_stem: &str,
) -> Result<CertFiles, PkiError> {
    let key = generate_key("certificate key")?;
    let cert = params
        .signed_by(&key, ca)
        .map_err(|source| PkiError::Generate {
            what: "certificate",
            source,
        })?;
    let files = CertFiles {
        cert: dir.join(format!("{file_stem}.crt")),
        key: dir.join(format!("{file_stem}.key")),
    };
    write(&files.cert, &cert.pem())?;
    write(&files.key, &key.serialize_pem())?;
    Ok(files)
}

fn write(path: &Path, contents: &str) -> Result<(), PkiError> {
    std::fs::write(path, contents).map_err(|source| PkiError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_are_signed_files_with_at_most_one_group() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let pki = Pki::generate(dir.path())?;
        let files = pki.client_cert("alice", &["team"], "alice")?;
        let cert = std::fs::read_to_string(&files.cert)?;
        anyhow::ensure!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        anyhow::ensure!(std::fs::read_to_string(&files.key)?.contains("PRIVATE KEY"));
        let two_groups = pki.client_cert("bob", &["a", "b"], "bob");
        anyhow::ensure!(
            matches!(two_groups, Err(PkiError::TooManyGroups(_))),
            "{two_groups:?}"
        );
        Ok(())
    }
}
