//! The operator's HTTP endpoints: `/metrics` (Prometheus scrapes), `/healthz` (liveness:
//! the process serves requests) and `/readyz` (readiness, see [`Readiness`]).
//!
//! Plain HTTP on its own port: nothing here is secret (no label holds a credential) and the
//! probes come from the kubelet.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::task::JoinHandle;

use super::health::Readiness;
use super::metrics::{Format, Metrics};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("failed to listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to read the bound address")]
    LocalAddr(#[source] std::io::Error),
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    #[error("the HTTP server task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
}

/// What the endpoints report.
#[derive(Debug, Clone)]
pub struct ServerState {
    pub metrics: Metrics,
    pub readiness: Readiness,
}

/// A server started by [`serve`].
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// The address actually bound (the port the OS chose when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits until the server stopped (after the shutdown future completed and the open
    /// requests were answered).
    pub async fn wait(self) -> Result<(), ServerError> {
        self.task.await.map_err(ServerError::Task)?
    }
}

/// The routes, for embedding or testing without a socket.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `addr` (binding errors are returned here, not later) and serves until `shutdown`
/// completes.
pub async fn serve(
    addr: SocketAddr,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let local_addr = listener.local_addr().map_err(ServerError::LocalAddr)?;
    let app = router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ServerError::Serve)
    });
    tracing::info!(%local_addr, "serving /metrics, /healthz and /readyz");
    Ok(RunningServer { local_addr, task })
}

async fn metrics(State(state): State<ServerState>, headers: HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok());
    let format = Format::negotiate(accept);
    match state.metrics.encode(format) {
        Ok(text) => ([(header::CONTENT_TYPE, format.content_type())], text).into_response(),
        Err(e) => {
            tracing::error!(error = %super::events::chain(&e), "failed to encode the metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<ServerState>) -> (StatusCode, &'static str) {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n")
    }
}
