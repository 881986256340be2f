//! Namespaces: waiting for `default` at start-up, and one fresh namespace per test.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

use super::{ControlPlane, ControlPlaneError};

impl ControlPlane {
    /// An admin client and a fresh namespace for one test (see [`create_namespace`]).
    pub async fn test_namespace(
        &self,
        prefix: &str,
    ) -> Result<(kube::Client, String), ControlPlaneError> {
        let client = self.client().await?;
        let namespace = create_namespace(&client, prefix).await?;
        Ok((client, namespace))
    }

    /// Like envtest: the apiserver is usable once its bootstrap controller created `default`.
    pub(super) async fn wait_for_default_namespace(&self) -> Result<(), ControlPlaneError> {
        let namespaces: Api<Namespace> = Api::all(self.client().await?);
        let timeout = self.options.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last_error = match namespaces.get_opt("default").await {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => "not found".to_owned(),
                Err(error) => error.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(ControlPlaneError::DefaultNamespace {
                    timeout,
                    last_error,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Creates a namespace named `<prefix>-<random suffix>` (the API server picks the suffix) and
/// returns its name: one per test keeps tests sharing a control plane apart.
pub async fn create_namespace(
    client: &kube::Client,
    prefix: &str,
) -> Result<String, ControlPlaneError> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let created = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(ControlPlaneError::CreateNamespace)?;
    created
        .metadata
        .name
        .ok_or(ControlPlaneError::UnnamedNamespace)
}
