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
//! | `GET /v1/machines?cluster=C&limit=L&after=ID` (each optional, without `uid`) | 200 `{"machines": [...], "next": ID \| null}`: a page, in id order, of the machines tagged `vmop.dev/cluster: C` (any machine without `cluster`), those after id `ID` only (which need not exist any more), at most `L` (1..=1000, default 1000); `next` is the page's last id when more follow, else `null`; 400 for another `limit` or a bad escape |
//! | `GET /v1/machines/{id}` | 200, the machine; 404 |
//! | `DELETE /v1/machines/{id}` | 204; 404 |
//! | `POST /v1/machines/{id}/start`, `.../stop` | 200, the machine (idempotent); 404 |
//! | `PATCH /v1/machines/{id}` `{cpu?, memoryMib?}` | 200, the machine; 409 when it would change a running machine; 404 |
//! | `GET /v1/stats` | 200, [`Stats`] |
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
//! without `Authorization: Bearer <token>` is 401; with a [`Config::rate_limit`], a request
//! beyond it is 429 with `Retry-After` (whole seconds).
//! The cloud deduplicates creates by uid only when asked (`ifAbsent`): otherwise that is the
//! provider's job (the Python testcloud provider does it with `find` first).
//!
//! # Guarantees
//!
//! - State lives as long as the [`Cloud`] (or the binary's process); nothing touches disk.
//! - [`Config::latency`] delays every answer without holding any lock, so a slow cloud still
//!   serves requests in parallel.

mod api;
mod rate;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

pub use store::{Machine, Power, Stats};

use api::Shared;

/// The image every testcloud knows unless told otherwise.
pub const IMAGE: &str = "tc-ubuntu-24.04";

/// A request rate: `per_second` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

/// How a testcloud behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The bearer token every request must carry; `None` accepts any request.
    pub token: Option<String>,
    /// The images `create` accepts; any other is 422.
    pub images: Vec<String>,
    /// A delay before every answer (a slow backend).
    pub latency: Duration,
    /// Requests beyond this rate are answered 429.
    pub rate_limit: Option<RateLimit>,
}

impl Default for Config {
    /// No token, the image [`IMAGE`], no latency, no rate limit.
    fn default() -> Self {
        Config {
            token: None,
            images: vec![IMAGE.to_owned()],
            latency: Duration::ZERO,
            rate_limit: None,
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

    pub fn with_rate_limit(mut self, per_second: f64, burst: u32) -> Self {
        self.rate_limit = Some(RateLimit { per_second, burst });
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
