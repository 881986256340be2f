//! Leader election against the real API server: of two candidates exactly one leads; a leader
//! that dies is replaced once its lease expires, one that releases at once, and one cut off
//! from the API server steps down before the other takes over. A monitor samples both
//! leadership channels on every change and fails the test if both ever say `true`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use vmop::leader::{LeaderElector, Leadership, LeaseConfig};
use vmop::telemetry::metrics::{Format, Metrics};
use vmop_tests::controlplane::ControlPlane;

/// Generous: the machine may be busy compiling; a test that passes never waits this long.
const DEADLINE: Duration = Duration::from_secs(60);
const LEASE: &str = "vmop-leader";

/// Short timings so that expiry happens within a test, with a renew deadline of a dozen
/// retries so that a busy machine does not make the leader step down.
fn fast(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new(LEASE, namespace, identity)
    }
}

/// Expiry takes longer than [`DEADLINE`]: a hand-over within a test can only come from a
/// release, and a leader never loses the lease to a slow machine.
fn slow(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(120),
        renew_deadline: Duration::from_secs(90),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new(LEASE, namespace, identity)
    }
}

/// Both leadership channels, sampled on every change of either.
struct Monitor {
    history: Arc<Mutex<Vec<(bool, bool)>>>,
    task: JoinHandle<()>,
}

impl Monitor {
    fn start(mut a: watch::Receiver<bool>, mut b: watch::Receiver<bool>) -> Monitor {
        let history = Arc::new(Mutex::new(vec![(*a.borrow(), *b.borrow())]));
        let record = history.clone();
        let task = tokio::spawn(async move {
            let (mut a_open, mut b_open) = (true, true);
            while a_open || b_open {
                tokio::select! {
                    changed = a.changed(), if a_open => a_open = changed.is_ok(),
                    changed = b.changed(), if b_open => b_open = changed.is_ok(),
                }
                let sample = (*a.borrow_and_update(), *b.borrow_and_update());
                if let Ok(mut history) = record.lock() {
                    history.push(sample);
                }
            }
        });
        Monitor { history, task }
    }

    /// Fails if both ever led at once; returns the samples.
    fn check(self) -> anyhow::Result<Vec<(bool, bool)>> {
        self.task.abort();
        let history = self
            .history
            .lock()
            .map_err(|_| anyhow::anyhow!("monitor poisoned"))?
            .clone();
        ensure!(
            !history.contains(&(true, true)),
            "both candidates led at once: {history:?}"
        );
        Ok(history)
    }
}

async fn wait_leading(leadership: &Leadership, leading: bool) -> anyhow::Result<()> {
    let mut rx = leadership.subscribe();
    tokio::time::timeout(DEADLINE, rx.wait_for(|l| *l == leading))
        .await
        .with_context(|| format!("leadership did not become {leading} in time"))?
        .context("the election task ended")?;
    Ok(())
}

async fn lease(client: &kube::Client, namespace: &str) -> anyhow::Result<Lease> {
    Ok(Api::<Lease>::namespaced(client.clone(), namespace)
        .get(LEASE)
        .await?)
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

fn transitions(lease: &Lease) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or_default()
}

/// Waits until the leader renewed the Lease `times` times (its resourceVersion changed).
async fn renewals(client: &kube::Client, namespace: &str, times: usize) -> anyhow::Result<()> {
    let mut seen = lease(client, namespace).await?.metadata.resource_version;
    let mut count = 0;
    tokio::time::timeout(DEADLINE, async {
        while count < times {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let version = lease(client, namespace).await?.metadata.resource_version;
            if version != seen {
                count += 1;
                seen = version;
            }
        }
        anyhow::Ok(())
    })
    .await
    .context("the leader stopped renewing")?
}

#[tokio::test]
async fn exactly_one_of_two_candidates_leads() -> anyhow::Result<()> {
    let (client, namespace) = ControlPlane::shared()
        .await?
        .test_namespace("leader")
        .await?;
    let a = LeaderElector::new(client.clone(), slow(&namespace, "a"))?.start();
    let b = LeaderElector::new(client.clone(), slow(&namespace, "b"))?.start();
    let monitor = Monitor::start(a.subscribe(), b.subscribe());

    let mut either = (a.subscribe(), b.subscribe());
    tokio::time::timeout(DEADLINE, async {
        loop {
            if *either.0.borrow_and_update() || *either.1.borrow_and_update() {
                return;
            }
            tokio::select! {
                _ = either.0.changed() => {}
                _ = either.1.changed() => {}
            }
        }
    })
    .await
    .context("nobody became the leader")?;
    let (leader, follower, identity) = if a.is_leading() {
        (&a, &b, "a")
    } else {
        (&b, &a, "b")
    };
    ensure!(leader.is_leading() && !follower.is_leading());
    ensure!(holder(&lease(&client, &namespace).await?) == Some(identity));

    // Many renewals: the follower never takes over a lease that is being renewed.
    renewals(&client, &namespace, 20).await?;
    ensure!(leader.is_leading() && !follower.is_leading());
    ensure!(holder(&lease(&client, &namespace).await?) == Some(identity));

    a.release().await?;
    b.release().await?;
    monitor.check()?;
    Ok(())
}

#[tokio::test]
async fn a_dead_leader_is_replaced_after_its_lease_expires() -> anyhow::Result<()> {
    let (client, namespace) = ControlPlane::shared()
        .await?
        .test_namespace("leader")
        .await?;
    let metrics = Metrics::new();
    let a = LeaderElector::new(client.clone(), fast(&namespace, "a"))?
        .with_metrics(metrics.clone())
        .start();
    wait_leading(&a, true).await?;
    let status = |n: u8| format!(r#"leader_election_master_status{{name="{LEASE}"}} {n}"#);
    let text = metrics.encode(Format::Prometheus)?;
    ensure!(text.lines().any(|l| l == status(1)), "{text}");

    let b = LeaderElector::new(client.clone(), fast(&namespace, "b"))?.start();
    let monitor = Monitor::start(a.subscribe(), b.subscribe());
    renewals(&client, &namespace, 3).await?;
    ensure!(!b.is_leading(), "took over a lease that is being renewed");
    let before = lease(&client, &namespace).await?;

    // Stop renewing without releasing, as a crashed process would.
    a.abandon().await;
    let text = metrics.encode(Format::Prometheus)?;
    ensure!(text.lines().any(|l| l == status(0)), "{text}");
    let still_held = lease(&client, &namespace).await?;
    ensure!(holder(&still_held) == Some("a"), "the lease was released");

    wait_leading(&b, true).await?;
    let after = lease(&client, &namespace).await?;
    ensure!(holder(&after) == Some("b"));
    ensure!(transitions(&after) == transitions(&before) + 1);
    b.release().await?;
    monitor.check()?;
    Ok(())
}

#[tokio::test]
async fn a_released_lease_is_taken_over_without_waiting_for_it_to_expire() -> anyhow::Result<()> {
    let (client, namespace) = ControlPlane::shared()
        .await?
        .test_namespace("leader")
        .await?;
    let a = LeaderElector::new(client.clone(), slow(&namespace, "a"))?.start();
    wait_leading(&a, true).await?;
    let b = LeaderElector::new(client.clone(), slow(&namespace, "b"))?.start();
    let monitor = Monitor::start(a.subscribe(), b.subscribe());
    let a_leading = a.subscribe();

    a.release().await?;
    ensure!(!*a_leading.borrow(), "still leading after the release");
    wait_leading(&b, true).await?;
    ensure!(holder(&lease(&client, &namespace).await?) == Some("b"));
    b.release().await?;
    ensure!(holder(&lease(&client, &namespace).await?).is_none());
    monitor.check()?;
    Ok(())
}

/// Forwards TCP to the API server until cut; then holds every connection open without
/// passing a byte (a network partition where requests hang rather than fail).
struct Partition {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Partition {
    async fn start(upstream: SocketAddr) -> anyhow::Result<Partition> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut = cut_rx.clone();
                tokio::spawn(async move {
                    let open = !*cut.borrow();
                    if open && let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                            _ = cut.wait_for(|c| *c) => {}
                        }
                    }
                    // Keeps `inbound` open and silent until the test's runtime ends.
                    std::future::pending::<()>().await;
                });
            }
        });
        Ok(Partition { addr, cut, task })
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An admin client that reaches the API server through `partition`.
async fn client_through(
    control_plane: &ControlPlane,
    partition: &Partition,
) -> anyhow::Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(control_plane.kubeconfig())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.cluster_url = format!("https://{}", partition.addr).parse()?;
    Ok(kube::Client::try_from(config)?)
}

#[tokio::test]
async fn a_partitioned_leader_steps_down_before_the_other_takes_over() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared().await?;
    let (client, namespace) = control_plane.test_namespace("leader").await?;
    let upstream: SocketAddr = control_plane
        .server_url()
        .trim_start_matches("https://")
        .parse()?;
    let partition = Partition::start(upstream).await?;
    let cut_off = client_through(control_plane, &partition).await?;

    let a = LeaderElector::new(cut_off, fast(&namespace, "a"))?.start();
    wait_leading(&a, true).await?;
    let b = LeaderElector::new(client.clone(), fast(&namespace, "b"))?.start();
    let monitor = Monitor::start(a.subscribe(), b.subscribe());
    renewals(&client, &namespace, 3).await?;
    ensure!(!b.is_leading());

    partition.cut();
    wait_leading(&b, true).await?;
    let history = monitor.check()?;
    ensure!(!a.is_leading(), "the cut-off leader did not step down");
    ensure!(holder(&lease(&client, &namespace).await?) == Some("b"));
    // The samples show the hand-over in order: a alone, nobody, b alone.
    let a_alone = history.iter().position(|s| *s == (true, false));
    let b_alone = history.iter().rposition(|s| *s == (false, true));
    ensure!(
        matches!((a_alone, b_alone), (Some(x), Some(y)) if x < y),
        "{history:?}"
    );

    a.abandon().await;
    b.release().await?;
    Ok(())
}
