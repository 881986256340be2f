//! The Python EC2 provider (`providers/python/ec2`, componentize-py) in the operator and under
//! load: a VirtualMachine on the real control plane becomes Ready through it and its deletion
//! terminates the instance in moto; and 64 of its calls are in flight at once, all answered,
//! with the operator's default engine (`--max-plugin-instances 64`).

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use kube::ResourceExt;
use kube::api::DeleteParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use vmop::api::VmPhase;
use vmop::plugin::{
    CallContext, EgressPolicy, EngineConfig, PluginEngine, PluginRegistry, ProviderSettings,
    RegistryConfig,
};
use vmop_tests::moto::{AwsCredentials, Moto};
use vmop_tests::operator::Env;

use crate::operator_bin;

const PYTHON_PLUGIN: &str = "ec2-py.wasm";
const GUEST: &str = "vmop_provider_ec2_py";
/// The operator's default `--max-plugin-instances`.
const IN_FLIGHT: usize = 64;

#[tokio::test]
async fn python_provider_vm_becomes_ready_and_deletion_terminates_it() -> anyhow::Result<()> {
    let env = Env::new("python").await?;
    let wasm = vmop_tests::wasm::path(GUEST)?;
    std::fs::copy(wasm, env.plugin_dir.path().join(PYTHON_PLUGIN))?;
    let secret = "creds-py";
    env.create_secret(
        secret,
        &AwsCredentials {
            access_key_id: "AKIDTESTTESTTESTTEST".to_owned(),
            secret_access_key: "not-checked".to_owned(),
        },
    )
    .await?;
    let mut pc = env.provider_config("py", secret);
    pc.spec.plugin.path = PYTHON_PLUGIN.to_owned();
    env.apply_provider_config(&pc).await?;
    let provider = pc.name_any();
    let _operator = env.operator().start(operator_bin())?;

    let created = env.create_vm(env.vm("py-web", &provider)).await?;
    let uid = created.uid().context("created VM without uid")?;
    let ready = env.wait_ready("py-web").await?;
    let status = ready.status.context("Ready VM without status")?;
    let id = status.id.context("Ready VM without status.id")?;
    ensure!(status.phase == Some(VmPhase::Running), "{:?}", status.phase);
    ensure!(
        env.live_instances(&uid)? == vec![id.clone()],
        "moto's instances for uid {uid}: {:?}",
        env.live_instances(&uid)?
    );

    env.vms().delete("py-web", &DeleteParams::default()).await?;
    env.wait_gone("py-web").await?;
    let state = env.moto.instance_state(&id)?;
    ensure!(
        state.as_deref() == Some("terminated"),
        "instance {id} is {state:?} after deletion"
    );
    Ok(())
}

/// A loopback proxy to moto that holds every connection until `release` turns true, counting
/// arrivals in `arrived`: a backend exactly as slow as the test needs, without sleeping.
async fn holding_proxy(
    upstream: u16,
    release: watch::Receiver<bool>,
) -> std::io::Result<(String, watch::Receiver<usize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let (arrivals, arrived) = watch::channel(0usize);
    let arrivals = Arc::new(arrivals);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (arrivals, mut release) = (arrivals.clone(), release.clone());
            tokio::spawn(async move {
                let mut first = vec![0u8; 64 << 10];
                let n = client.read(&mut first).await?;
                arrivals.send_modify(|count| *count += 1);
                release
                    .wait_for(|go| *go)
                    .await
                    .map_err(std::io::Error::other)?;
                let mut moto = TcpStream::connect(("127.0.0.1", upstream)).await?;
                moto.write_all(first.get(..n).unwrap_or_default()).await?;
                tokio::io::copy_bidirectional(&mut client, &mut moto).await?;
                Ok::<_, std::io::Error>(())
            });
        }
    });
    Ok((endpoint, arrived))
}

/// An error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn sixty_four_python_calls_in_flight_at_once_all_succeed() -> anyhow::Result<()> {
    let moto = Moto::start()?;
    let (release_tx, release) = watch::channel(false);
    let (endpoint, mut arrived) = holding_proxy(moto.port(), release).await?;

    let dir = tempfile::tempdir()?;
    std::fs::copy(
        vmop_tests::wasm::path(GUEST)?,
        dir.path().join(PYTHON_PLUGIN),
    )?;
    // As many instances as calls: the pool must hold 64 instances of a 14-core-instance
    // component at once.
    let engine = PluginEngine::new(&EngineConfig {
        max_instances: IN_FLIGHT as u32,
        ..EngineConfig::default()
    })?;
    let ctx = CallContext {
        settings: ProviderSettings {
            settings: [("region", "us-east-1"), ("endpoint", endpoint.as_str())]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            secrets: [("access_key_id", "AKID"), ("secret_access_key", "x")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            cluster: "vmop-tests".to_owned(),
        },
        egress: EgressPolicy::parse(std::slice::from_ref(&endpoint))?,
        label: "python-in-flight".to_owned(),
        ..CallContext::default()
    };
    let registry = PluginRegistry::new(
        engine,
        RegistryConfig {
            plugin_dir: dir.path().to_path_buf(),
            cache_dir: None,
            info_limits: ctx.limits,
        },
    )?;
    let plugin = registry.load(PYTHON_PLUGIN, None).await?;

    let mut calls = tokio::task::JoinSet::new();
    for i in 0..IN_FLIGHT {
        let (plugin, ctx) = (plugin.clone(), ctx.clone());
        calls.spawn(async move { plugin.find(&ctx, &format!("in-flight-{i}")).await });
    }
    // Every call either reaches the backend (and is held there) or fails without reaching it;
    // release once all are accounted for, so a failure cannot hang the test.
    let mut early = Vec::new();
    while *arrived.borrow() + early.len() < IN_FLIGHT {
        tokio::select! {
            changed = arrived.changed() => changed?,
            Some(done) = calls.join_next() => early.push(done?),
        }
    }
    let held = *arrived.borrow();
    release_tx.send(true)?;
    let mut results = early;
    while let Some(done) = calls.join_next().await {
        results.push(done?);
    }
    let failures: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| chain(e))
        .collect();
    ensure!(
        held == IN_FLIGHT && failures.is_empty(),
        "{held} of {IN_FLIGHT} calls reached the backend at once; {} failed, first: {:?}",
        failures.len(),
        failures.first()
    );
    ensure!(results.iter().all(|r| matches!(r, Ok(None))), "{results:?}");
    Ok(())
}
