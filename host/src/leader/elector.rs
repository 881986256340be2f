//! The election loop: acquire, renew, step down, release.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};

use super::fence::Fence;
use super::record::{self, Decision, Observed};
use super::validity::Validity;
use super::{LeaderError, LeaseConfig};
use crate::telemetry::metrics::Metrics;

/// Campaigns for a Lease; see the module docs for the guarantees.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    metrics: Option<Metrics>,
    gate: Option<watch::Receiver<bool>>,
    fence: Option<watch::Receiver<Fence>>,
}

/// A running election, started by [`LeaderElector::start`].
///
/// Dropping it (or [`Leadership::abandon`]) stops campaigning *without* releasing the Lease, as
/// a crash would: receivers see `false` as soon as the task is cancelled, and other candidates
/// take over once the lease expires. [`Leadership::release`] is the clean way out.
#[derive(Debug)]
pub struct Leadership {
    leading: watch::Receiver<bool>,
    until: watch::Receiver<Option<Instant>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), LeaderError>>>,
}

/// What one read-and-write of the Lease found.
#[derive(Debug)]
enum Attempt {
    /// We hold the lease now (created, taken over or renewed).
    Holding,
    /// Someone else holds a valid lease.
    HeldBy(String),
    /// Another writer changed the Lease between our read and our write; try again.
    Conflict,
}

/// Why a leader stopped leading.
#[derive(Debug)]
enum StepDown {
    /// `Ok` from [`Leadership::release`]; `Err` when the handle was dropped.
    Stopped(Result<(), oneshot::error::RecvError>),
    TakenBy(String),
    DeadlinePassed,
}

/// Publishes leadership to the channel and the `leader_election_master_status` gauge. Dropped
/// with the task (also when aborted), it publishes `false`: the channel never says `true`
/// unless a live task holds the lease.
struct Publisher {
    tx: watch::Sender<bool>,
    /// While leading: the renew deadline of the last successful renewal ([`Validity`]).
    until: watch::Sender<Option<Instant>>,
    metrics: Option<Metrics>,
    lease: String,
}

impl Publisher {
    fn set(&self, leading: bool) {
        if !leading {
            self.until.send_replace(None);
        }
        self.tx.send_replace(leading);
        if let Some(metrics) = &self.metrics {
            metrics.set_leader(&self.lease, leading);
        }
    }

    /// Leading until `until` unless renewed again: published before `true`, so that a
    /// [`Validity`] never sees `true` without a deadline.
    fn lead_until(&self, until: Instant) {
        self.until.send_replace(Some(until));
        self.set(true);
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.set(false);
    }
}

impl LeaderElector {
    /// Checks the timing invariants; see [`LeaseConfig`].
    pub fn new(client: kube::Client, config: LeaseConfig) -> Result<Self, LeaderError> {
        config.validate()?;
        Ok(LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            metrics: None,
            gate: None,
            fence: None,
        })
    }

    /// Take or create the Lease only while `gate` says `true` (renewing a held one is always
    /// allowed). The Lease is read every retry period meanwhile, so once the gate opens a
    /// takeover waits only for the holder's last renewal to expire, not for a whole lease
    /// duration of fresh observation (a standby for a shard, `shards.rs`).
    pub fn with_gate(mut self, gate: watch::Receiver<bool>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Hold the Lease only as `fence` admits (`fence.rs`): a candidate whose layout is not in
    /// force, or a Lease stamped by a newer layout generation, is never created, taken or
    /// renewed, and every write stamps the Lease with this candidate's generation.
    pub fn with_fence(mut self, fence: watch::Receiver<Fence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Also report leadership as `leader_election_master_status{name=<lease>}`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Starts campaigning in a background task.
    pub fn start(self) -> Leadership {
        let (tx, leading) = watch::channel(false);
        let (until_tx, until) = watch::channel(None);
        let (stop_tx, stop_rx) = oneshot::channel();
        let publisher = Publisher {
            tx,
            until: until_tx,
            metrics: self.metrics.clone(),
            lease: self.config.name.clone(),
        };
        publisher.set(false);
        let task = tokio::spawn(self.run(publisher, stop_rx));
        Leadership {
            leading,
            until,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }

    async fn run(
        self,
        publisher: Publisher,
        mut stop: oneshot::Receiver<()>,
    ) -> Result<(), LeaderError> {
        let config = &self.config;
        let mut observed = None;
        loop {
            let acquired_at = tokio::select! {
                biased;
                stopped = &mut stop => return self.stopped(stopped).await,
                at = self.campaign(&mut observed) => at,
            };
            publisher.lead_until(acquired_at + config.renew_deadline);
            tracing::info!(lease = %config.name, identity = %config.identity, "became the leader");
            let reason = self
                .lead(acquired_at, &mut observed, &mut stop, &publisher)
                .await;
            publisher.set(false);
            match reason {
                StepDown::Stopped(stopped) => return self.stopped(stopped).await,
                StepDown::TakenBy(holder) => {
                    tracing::warn!(lease = %config.name, %holder, "lost the lease to another holder")
                }
                StepDown::DeadlinePassed => tracing::warn!(
                    lease = %config.name,
                    renew_deadline = ?config.renew_deadline,
                    "could not renew the lease within the renew deadline; stepped down"
                ),
            }
        }
    }

    /// Releases on [`Leadership::release`]; a dropped handle means abandon (no release).
    async fn stopped(
        &self,
        stop: Result<(), oneshot::error::RecvError>,
    ) -> Result<(), LeaderError> {
        match stop {
            Ok(()) => self.release().await,
            Err(_dropped) => Ok(()),
        }
    }

    /// Tries every retry period until the lease is ours; returns when the successful attempt
    /// started (the lease is valid from no later than that instant).
    async fn campaign(&self, observed: &mut Option<Observed>) -> Instant {
        loop {
            let started = Instant::now();
            match timeout(self.config.renew_deadline, self.attempt(observed)).await {
                Ok(Ok(Attempt::Holding)) => return started,
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    tracing::debug!(lease = %self.config.name, %holder, "lease held by another candidate")
                }
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!(lease = %self.config.name, "lost a race for the lease")
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.config.name, error = %e, "failed to acquire the lease")
                }
                Err(_elapsed) => {
                    tracing::warn!(lease = %self.config.name, "acquiring the lease timed out")
                }
            }
            sleep(self.config.retry_period).await;
        }
    }

    /// Renews every retry period while leading. Each renewal must succeed within the renew
    /// deadline of the previous one's start; whatever blocks past it (errors, a hung API
    /// call) ends leadership at the deadline.
    async fn lead(
        &self,
        acquired_at: Instant,
        observed: &mut Option<Observed>,
        stop: &mut oneshot::Receiver<()>,
        publisher: &Publisher,
    ) -> StepDown {
        let mut renewed_at = acquired_at;
        loop {
            let deadline = renewed_at + self.config.renew_deadline;
            let renewal = timeout_at(deadline, self.renew(renewed_at, observed));
            tokio::select! {
                biased;
                stopped = &mut *stop => return StepDown::Stopped(stopped),
                outcome = renewal => match outcome {
                    Ok(Ok(at)) => {
                        renewed_at = at;
                        publisher.lead_until(at + self.config.renew_deadline);
                    }
                    Ok(Err(holder)) => return StepDown::TakenBy(holder),
                    Err(_elapsed) => return StepDown::DeadlinePassed,
                },
            }
        }
    }

    /// One renewal, retried every retry period: `Ok(start of the successful attempt)`, or
    /// `Err(holder)` when someone else holds the lease.
    async fn renew(
        &self,
        last: Instant,
        observed: &mut Option<Observed>,
    ) -> Result<Instant, String> {
        let mut next = last + self.config.retry_period;
        loop {
            sleep_until(next).await;
            let started = Instant::now();
            match self.attempt(observed).await {
                Ok(Attempt::Holding) => return Ok(started),
                Ok(Attempt::HeldBy(holder)) => return Err(holder),
                Ok(Attempt::Conflict) => {
                    tracing::debug!(lease = %self.config.name, "conflict renewing the lease; retrying")
                }
                Err(e) => {
                    tracing::warn!(lease = %self.config.name, error = %e, "failed to renew the lease; retrying")
                }
            }
            next = Instant::now() + self.config.retry_period;
        }
    }

    /// Reads the Lease and, if allowed, writes it holding it. The write carries the
    /// `resourceVersion` that was read, so of two candidates racing for the same version the
    /// API server accepts one and answers the other 409 Conflict.
    async fn attempt(&self, observed: &mut Option<Observed>) -> Result<Attempt, kube::Error> {
        let config = &self.config;
        let current = self.api.get_opt(&config.name).await?;
        let fence = self.fence.as_ref().map_or(Fence::Unfenced, |f| *f.borrow());
        if !fence.admits(current.as_ref()) {
            return Ok(Attempt::HeldBy(
                "(fenced: this candidate's layout is not in force, or the Lease is newer)"
                    .to_owned(),
            ));
        }
        let decision = record::decide(
            current.as_ref(),
            &config.identity,
            observed,
            Instant::now(),
            config.lease_duration,
        );
        let gated = self.gate.as_ref().is_some_and(|gate| !*gate.borrow());
        let write = match (decision, current) {
            (Decision::Wait { holder }, _) => return Ok(Attempt::HeldBy(holder)),
            (Decision::Create | Decision::Take, _) if gated => {
                return Ok(Attempt::HeldBy(
                    "(nobody; this candidate stands by)".to_owned(),
                ));
            }
            (Decision::Create, _) | (_, None) => {
                let mut lease = record::created(
                    &config.name,
                    &config.identity,
                    config.lease_duration,
                    Timestamp::now(),
                );
                fence.stamp(&mut lease);
                self.api.create(&PostParams::default(), &lease).await
            }
            (Decision::Take | Decision::Renew, Some(lease)) => {
                let mut lease = record::held(
                    lease,
                    &config.identity,
                    config.lease_duration,
                    Timestamp::now(),
                );
                fence.stamp(&mut lease);
                self.api
                    .replace(&config.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match write {
            Ok(_) => Ok(Attempt::Holding),
            // 409: AlreadyExists on create, Conflict on replace.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up if we still hold it, so that another candidate takes over at once.
    async fn release(&self) -> Result<(), LeaderError> {
        let name = &self.config.name;
        let released = timeout(self.config.renew_deadline, async {
            for _ in 0..3 {
                let Some(lease) = self.api.get_opt(name).await? else {
                    return Ok(());
                };
                if record::holder(&lease) != Some(self.config.identity.as_str()) {
                    return Ok(());
                }
                let lease = record::released(lease, Timestamp::now());
                match self.api.replace(name, &PostParams::default(), &lease).await {
                    Ok(_) => {
                        tracing::info!(lease = %name, "released the lease");
                        return Ok(());
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
        .await;
        match released {
            Ok(result) => result.map_err(LeaderError::Release),
            Err(_elapsed) => Err(LeaderError::ReleaseTimeout(self.config.renew_deadline)),
        }
    }
}

impl Leadership {
    /// A receiver of the leadership state: `true` while this process leads. Reconcile only
    /// while it is `true`, and stop at once when it turns `false`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Leadership with its deadline: a holder's own check that its Lease is still valid,
    /// which holds even before the election task has run again after a freeze.
    pub fn validity(&self) -> Validity {
        Validity {
            leading: self.leading.clone(),
            until: self.until.clone(),
        }
    }

    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// Stops campaigning and, if leading, publishes `false` and then clears the Lease's holder
    /// so another candidate takes over without waiting for it to expire. Stop the work that
    /// needs leadership *before* calling this.
    pub async fn release(mut self) -> Result<(), LeaderError> {
        if let Some(stop) = self.stop.take() {
            // The task may have ended already; then there is nothing to stop.
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(LeaderError::Task)?,
            None => Ok(()),
        }
    }

    /// Stops without releasing the Lease, as a crashed process would; returns once the
    /// election task is gone and receivers see `false`.
    pub async fn abandon(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            // Cancelled (or finished): either way the task and its Publisher are gone.
            let _ = task.await;
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
