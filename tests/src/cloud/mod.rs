//! "testcloud": a tiny stateful in-memory cloud with an HTTP JSON API, on loopback. It is the
//! backend of the `testcloud` provider (`providers/testcloud`), of the provider guide
//! (`providers/README.md`) and of the scale benchmark: machines are `running` the moment they
//! are created and every request costs O(log n) in the number of machines, a listing O(page)
//! more (machines ordered by id, indexes by uid and by cluster tag), so 10,000 VMs cost the
//! backend nothing worth measuring. Run it standalone with the
//! `vmop-testcloud` binary.
//!
//! # API
//!
//! | request | answer |
//! |---|---|
//! | `POST /v1/machines` `{uid, image, cpu, memoryMib, userData?, tags?, ifAbsent?}` | 201, the machine; with `ifAbsent: true` and a machine of `uid` already there, 200 and the oldest of them instead; 422 for an unknown image; 400 for a body that is not that JSON |
//! | `GET /v1/machines?uid=U` | 200 `{"machines": [...]}`, all the machines made for `U`, oldest first; 400 for a bad escape |
//! | `GET /v1/machines?cluster=C&limit=L&after=ID` (each optional, without `uid`) | 200 `{"machines": [...], "next": ID \| null}`: a page, in id order, of the machines tagged `vmop.dev/cluster: C` (any machine without `cluster`), those after id `ID` only (which need not exist any more), at most `L` (1..=1000, default 1000); `next` is the page's last id when more follow, else `null`; 400 for another `limit` or a bad escape; 503 while a test refuses listings ([`Cloud::refuse_listings`]) |
//! | `GET /v1/machines/{id}` | 200, the machine; 404 |
//! | `DELETE /v1/machines/{id}` | 204; 404 |
//! | `POST /v1/machines/{id}/start`, `.../stop` | 200, the machine (idempotent); 404 |
//! | `PATCH /v1/machines/{id}` `{cpu?, memoryMib?}` | 200, the machine; 409 when it would change a running machine; 404 |
//! | `GET /v1/stats` | 200, [`Stats`] |
//! | `GET /v1/limits` | 200 `{rateLimit, ec2, latencyMinMs, latencyMaxMs}`: the throttles ([`RateLimit`], [`Ec2Limits`], `null` when off) and the latency the cloud was started with |
//! | `POST /v1/limits/refill` | 204: every throttle's buckets full again (a benchmark starts each phase so) |
//!
//! A machine is `{id, uid, image, cpu, memoryMib, state: "running"|"stopped", userData?,
//! tags, addresses, created}`: `id` is `tc-` and the creation number in 8 hex digits, so ids
//! sort in creation order (for the first 2^32 machines); `tags` a string-to-string object,
//! fixed at creation; `created` the creation number. Paging by `after` sees every machine that
//! lives through the whole listing exactly once and none deleted before its page is read; one
//! created meanwhile has a greater id than any listed, so it comes on a later page unless the
//! listing has ended. Without any parameter the answer is the first page of all machines.
//!
//! Every refusal is `{"error": code, "message": text}`. With a [`Config::token`], a request
//! without `Authorization: Bearer <token>` is 401; with a [`Config::rate_limit`] (every
//! request) or [`Config::ec2`] (EC2's request and resource token buckets, see [`Ec2Limits`];
//! the harness's routes `/v1/stats` and `/v1/limits*` are exempt), a request beyond it is 429
//! with `Retry-After`: the wait for the tokens it needs, rounded up to whole seconds, at least
//! one. [`Stats`] counts the API's calls by class (reads: `GET`; mutations: any other method)
//! and the 429s by class.
//! The cloud deduplicates creates by uid only when asked (`ifAbsent`): otherwise that is the
//! provider's job (the Python testcloud provider does it with `find` first).
//!
//! # Guarantees
//!
//! - State lives as long as the [`Cloud`] (or the binary's process); nothing touches disk.
//! - [`Config::latency`] (or a draw up to [`Config::latency_max`]) delays every answer, throttled
//!   ones included, before any lock is taken, so a slow cloud still serves requests in parallel.
//! - A throttled request changes nothing and takes no token from the EC2-like buckets.

mod api;
mod rate;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use serde::Serialize;
use tokio::net::TcpListener;

pub use store::{Machine, Power, Stats};

use api::Shared;

/// The image every testcloud knows unless told otherwise.
pub const IMAGE: &str = "tc-ubuntu-24.04";

/// A request rate: `per_second` on average, `burst` at once (a token bucket of `burst`
/// tokens refilled at `per_second`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

impl RateLimit {
    /// `burst` and `per_second` times `factor`; the burst rounded, at least 1.
    pub fn scaled(self, factor: f64) -> Self {
        let burst = (f64::from(self.burst) * factor)
            .round()
            .clamp(1.0, f64::from(u32::MAX));
        RateLimit {
            per_second: self.per_second * factor,
            burst: burst as u32, // in range: clamped above
        }
    }
}

/// EC2-like throttling (the testcloud's model of EC2's "request throttling for the Amazon EC2
/// API"): a request bucket for non-mutating requests (`read`: every `GET` of the API) and one
/// for mutating requests (`mutate`: every other method), and resource buckets that a create
/// (`run`: `RunInstances`, one instance) and a delete (`terminate`: `TerminateInstances`) take
/// a token from as well. A request is refused, 429 with `Retry-After`, unless every bucket it
/// needs has a token; a refused request takes none. The harness routes (`/v1/stats`,
/// `/v1/limits`) are not throttled by them.
///
/// EC2 keeps a request bucket per API action; here all mutating requests share one (in EC2
/// every read the testcloud serves would be `DescribeInstances`, so reads sharing one bucket is
/// what EC2 does).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ec2Limits {
    pub read: RateLimit,
    pub mutate: RateLimit,
    pub run: RateLimit,
    pub terminate: RateLimit,
}

impl Ec2Limits {
    /// EC2's documented default figures: non-mutating actions 100 tokens refilled at 20/s,
    /// mutating actions 200 at 5/s, the `RunInstances` resource bucket 1000 at 2/s and the
    /// `TerminateInstances` one 1000 at 20/s.
    pub const EC2: Ec2Limits = Ec2Limits {
        read: RateLimit {
            per_second: 20.0,
            burst: 100,
        },
        mutate: RateLimit {
            per_second: 5.0,
            burst: 200,
        },
        run: RateLimit {
            per_second: 2.0,
            burst: 1000,
        },
        terminate: RateLimit {
            per_second: 20.0,
            burst: 1000,
        },
    };

    /// Every bucket's burst and rate times `factor` (see [`RateLimit::scaled`]).
    pub fn scaled(self, factor: f64) -> Self {
        Ec2Limits {
            read: self.read.scaled(factor),
            mutate: self.mutate.scaled(factor),
            run: self.run.scaled(factor),
            terminate: self.terminate.scaled(factor),
        }
    }
}

impl Default for Ec2Limits {
    /// [`Ec2Limits::EC2`].
    fn default() -> Self {
        Ec2Limits::EC2
    }
}

/// How a testcloud behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The bearer token every request must carry; `None` accepts any request.
    pub token: Option<String>,
    /// The images `create` accepts; any other is 422.
    pub images: Vec<String>,
    /// A delay before every answer (a slow backend); with a greater [`Config::latency_max`],
    /// the least delay.
    pub latency: Duration,
    /// When greater than [`Config::latency`], each answer's delay is drawn uniformly from
    /// `latency..=latency_max` (not reproducibly: the draw is seeded from the clock).
    pub latency_max: Duration,
    /// Requests beyond this rate are answered 429.
    pub rate_limit: Option<RateLimit>,
    /// EC2-like throttling: requests beyond these buckets are answered 429.
    pub ec2: Option<Ec2Limits>,
}

impl Default for Config {
    /// No token, the image [`IMAGE`], no latency, no rate limit, no EC2-like throttling.
    fn default() -> Self {
        Config {
            token: None,
            images: vec![IMAGE.to_owned()],
            latency: Duration::ZERO,
            latency_max: Duration::ZERO,
            rate_limit: None,
            ec2: None,
        }
    }
}

impl Config {
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Also accept `image`.
    pub fn with_image(mut self, image: impl Into<String>) -> Self {
        self.images.push(image.into());
        self
    }

    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// A delay drawn uniformly from `min..=max` before every answer (`min` when `max <= min`).
    pub fn with_latency_range(mut self, min: Duration, max: Duration) -> Self {
        self.latency = min;
        self.latency_max = max;
        self
    }

    pub fn with_rate_limit(mut self, per_second: f64, burst: u32) -> Self {
        self.rate_limit = Some(RateLimit { per_second, burst });
        self
    }

    /// EC2-like throttling with these buckets ([`Ec2Limits::EC2`] for EC2's own figures).
    pub fn with_ec2(mut self, limits: Ec2Limits) -> Self {
        self.ec2 = Some(limits);
        self
    }
}

/// A testcloud serving in this process; it stops when dropped.
#[derive(Debug)]
pub struct Cloud {
    endpoint: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Cloud {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cloud {
    /// Serves on a free loopback port.
    pub async fn start(config: Config) -> std::io::Result<Cloud> {
        Cloud::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config).await
    }

    /// Serves on `addr`.
    pub async fn bind(addr: SocketAddr, config: Config) -> std::io::Result<Cloud> {
        let listener = TcpListener::bind(addr).await?;
        let endpoint = endpoint(&listener)?;
        let shared = Arc::new(Shared::new(config));
        let app = router(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Cloud {
            endpoint,
            shared,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn stats(&self) -> Stats {
        self.shared.store().stats
    }

    /// Every live machine, oldest first.
    pub fn machines(&self) -> Vec<Machine> {
        self.shared.store().all()
    }

    /// Ids of the live machines, oldest first.
    pub fn live(&self) -> Vec<String> {
        self.machines().into_iter().map(|m| m.id).collect()
    }

    /// Starts or stops machine `id` behind the operator's back; `false` if there is none.
    pub fn power(&self, id: &str, state: Power) -> bool {
        self.shared.store().power(id, state).is_some()
    }

    /// While `refused`, every paged listing (`GET /v1/machines` without `uid`) answers 503
    /// `unavailable`; other requests are served as ever.
    pub fn refuse_listings(&self, refused: bool) {
        self.shared
            .refuse_listings
            .store(refused, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `http://<address of listener>`.
pub fn endpoint(listener: &TcpListener) -> std::io::Result<String> {
    Ok(format!("http://{}", listener.local_addr()?))
}

/// Serves the API on `listener` until the process ends (the binary's loop).
pub async fn serve(listener: TcpListener, config: Config) -> std::io::Result<()> {
    axum::serve(listener, router(Arc::new(Shared::new(config)))).await
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(api::handle).with_state(shared)
}
