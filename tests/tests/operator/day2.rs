//! Shared by the day-2 operator tests: moto helpers (subnets, instances made behind the
//! operator's back, instance attributes) and VM patches.

use anyhow::Context as _;
use kube::api::{Patch, PatchParams};
use vmop::api::{PluginStatus, ProviderConfig, VirtualMachine};
use vmop_tests::moto::Moto;
use vmop_tests::operator::{Env, IMAGE, wait_for};

/// The text of the first `<tag>...</tag>` in `xml`.
pub fn element(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml.get(start..)?.find(&close)?;
    xml.get(start..end).map(str::to_owned)
}

/// A new VPC with one subnet of `cidr` (a /24 inside 10.<n>.0.0/16); the subnet's id.
pub fn subnet(moto: &Moto, n: u8) -> anyhow::Result<String> {
    let vpc_cidr = format!("10.{n}.0.0/16");
    let body = moto.ec2("CreateVpc", &[("CidrBlock", vpc_cidr.as_str())])?;
    let vpc = element(&body, "vpcId").context("CreateVpc answered no vpcId")?;
    let cidr = format!("10.{n}.1.0/24");
    let body = moto.ec2(
        "CreateSubnet",
        &[("VpcId", vpc.as_str()), ("CidrBlock", cidr.as_str())],
    )?;
    element(&body, "subnetId").context("CreateSubnet answered no subnetId")
}

/// An instance made directly in moto (not by the operator); its id.
pub fn run_instance(moto: &Moto, instance_type: &str) -> anyhow::Result<String> {
    let body = moto.ec2(
        "RunInstances",
        &[
            ("ImageId", IMAGE),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("InstanceType", instance_type),
        ],
    )?;
    element(&body, "instanceId").context("RunInstances answered no instanceId")
}

/// `field` (`subnetId`, `instanceType`, ...) of instance `id` as moto reports it.
pub fn instance_field(moto: &Moto, id: &str, field: &str) -> anyhow::Result<Option<String>> {
    let body = moto.ec2("DescribeInstances", &[("InstanceId.1", id)])?;
    Ok(element(&body, field))
}

/// Merge-patches VM `name` with `patch` (e.g. `{"spec": {"cpu": 2}}`).
pub async fn patch_vm(
    env: &Env,
    name: &str,
    patch: serde_json::Value,
) -> anyhow::Result<VirtualMachine> {
    env.vms()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("failed to patch VirtualMachine {name} with {patch}"))
}

/// The condition `type_` of `vm`, as `(status, reason, message)`.
pub fn condition(vm: &VirtualMachine, type_: &str) -> Option<(String, String, String)> {
    vm.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// What ProviderConfig `provider` publishes of its plugin, once it names parameter `name`.
pub async fn published_plugin(
    env: &Env,
    provider: &str,
    name: &str,
) -> anyhow::Result<PluginStatus> {
    let pc = wait_for(
        env.provider_configs(),
        provider,
        "publishing the plugin's parameters",
        |pc: Option<&ProviderConfig>| {
            pc.and_then(|pc| pc.status.as_ref())
                .and_then(|s| s.plugin.as_ref())
                .is_some_and(|p| p.parameters.iter().any(|p| p.name == name))
        },
    )
    .await?
    .context("ProviderConfig vanished")?;
    pc.status.and_then(|s| s.plugin).context("no plugin status")
}
