//! The operator under the least privilege the shipped manifests grant (`deploy/clusterrole.yaml`,
//! `deploy/role.yaml`): with exactly those rules, bound to an ordinary user instead of the
//! ServiceAccount, a VM goes through its whole life, with leader election on.

use std::path::Path;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use serde::Deserialize;
use vmop_tests::operator::{Env, wait_for};

use crate::operator_bin;

/// The first document of `kind` in a multi-document manifest of `deploy/`.
fn manifest<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> anyhow::Result<T> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for document in serde_norway::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(document)?;
        if value.get("kind").and_then(|k| k.as_str()) == Some(kind) {
            return Ok(serde_json::from_value(value)?);
        }
    }
    anyhow::bail!("no {kind} in {}", path.display())
}

fn user(name: &str) -> Subject {
    Subject {
        kind: "User".to_owned(),
        name: name.to_owned(),
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        namespace: None,
    }
}

#[tokio::test]
async fn operator_works_with_the_shipped_rbac_only() -> anyhow::Result<()> {
    let env = Env::new("rbac").await?;
    let name = format!("vmop-{}", env.namespace);
    let post = PostParams::default();

    let shipped: ClusterRole = manifest("clusterrole.yaml", "ClusterRole")?;
    let cluster_role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        rules: shipped.rules,
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(env.client.clone())
        .create(&post, &cluster_role)
        .await?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: name.clone(),
        },
        subjects: Some(vec![user(&name)]),
    };
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&post, &binding)
        .await?;

    let shipped: Role = manifest("role.yaml", "Role")?;
    let role = Role {
        metadata: ObjectMeta {
            name: Some("vmop".to_owned()),
            namespace: Some(env.namespace.clone()),
            ..ObjectMeta::default()
        },
        rules: shipped.rules,
    };
    Api::<Role>::namespaced(env.client.clone(), &env.namespace)
        .create(&post, &role)
        .await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("vmop".to_owned()),
            namespace: Some(env.namespace.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: "vmop".to_owned(),
        },
        subjects: Some(vec![user(&name)]),
    };
    Api::<RoleBinding>::namespaced(env.client.clone(), &env.namespace)
        .create(&post, &binding)
        .await?;

    let provider = env.standard_provider("aws").await?;
    let mut args =
        env.operator()
            .args_from(["--leader-elect", "--leader-election-id", "vmop-rbac"]);
    args.kubeconfig = env.control_plane.user_kubeconfig(&name, &[])?;
    let operator = args.start(operator_bin())?;

    let vm = env
        .vm("least", &provider)
        .connection_config_map("least-connection");
    env.create_vm(vm).await?;
    let id = env
        .wait_ready("least")
        .await
        .with_context(|| format!("operator log:\n{}", operator.log()))?
        .status
        .and_then(|s| s.id)
        .context("no id")?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(env.client.clone(), &env.namespace);
    wait_for(cms, "least-connection", "created", |cm| cm.is_some()).await?;
    // Events too (a routine create writes none; a VM without its ProviderConfig does).
    env.create_vm(env.vm("orphan", "no-such-provider")).await?;
    env.wait_vm_event("orphan", "ProviderConfigNotFound")
        .await?;
    let lease = Api::<Lease>::namespaced(env.client.clone(), &env.namespace)
        .get("vmop-rbac")
        .await?;
    ensure!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty()),
        "the Lease has no holder"
    );

    env.vms().delete("least", &DeleteParams::default()).await?;
    env.wait_gone("least").await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "instance {id} is {state:?}"
    );
    let forbidden = operator
        .log()
        .lines()
        .filter(|l| l.contains("forbidden"))
        .count();
    ensure!(
        forbidden == 0,
        "the operator was refused {forbidden} times:\n{}",
        operator.log()
    );
    Ok(())
}
