//! [`Connections`]: idle HTTP/1.1 connections kept for the next request to the same place, so
//! that a burst of plugin calls to one cloud endpoint pays one TCP (and TLS) handshake per
//! connection, not per request: a full TLS handshake costs more CPU than the API call it
//! carries.
//!
//! # Guarantees
//!
//! - A connection is reused only for the ProviderConfig that opened it, and only to the exact
//!   scheme, host name (the TLS server name), address and port of the new request, *after* that
//!   request passed every egress check: reuse never reaches an address the policy refused
//!   (`tests::connections_are_reused_per_destination_and_provider`).
//! - A connection goes back only once its response was read to the end; a body dropped early,
//!   a server that closes, or `Connection: close` ends it (`tests::a_connection_is_not_reused_after_close_or_an_unread_body`).
//! - Bounded: at most [`MAX_IDLE_PER_KEY`] idle connections per destination and
//!   [`MAX_IDLE`] in all, none older than [`IDLE_TIMEOUT`] (expired ones are dropped on every
//!   return and checkout).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;
use wasmtime_wasi_http::WasiBody;

use super::address::HostKind;
use super::allowlist::{Scheme, Target};

/// How long an idle connection is kept: shorter than the idle timeouts of common servers and
/// load balancers (60 s and more), so a kept connection is rarely one the server is closing.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Idle connections kept per destination.
pub const MAX_IDLE_PER_KEY: usize = 32;
/// Idle connections kept in all.
pub const MAX_IDLE: usize = 256;

/// Where a connection goes, and for whom.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    provider: String,
    https: bool,
    host: String,
    ip: IpAddr,
    port: u16,
}

impl Key {
    pub(crate) fn new(provider: &str, target: &Target, ip: IpAddr) -> Self {
        Key {
            provider: provider.to_owned(),
            https: target.scheme == Scheme::Https,
            host: match &target.host {
                HostKind::Name(name) => name.clone(),
                HostKind::Ip(ip) => ip.to_string(),
                HostKind::AmbiguousNumeric => String::new(),
            },
            ip,
            port: target.port,
        }
    }
}

struct Idle {
    sender: SendRequest<WasiBody>,
    since: Instant,
}

/// Idle connections, shared by every call of the ProviderConfigs that hold this value; cheap
/// to clone.
#[derive(Clone, Default)]
pub struct Connections {
    idle: Arc<Mutex<HashMap<Key, Vec<Idle>>>>,
}

impl fmt::Debug for Connections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connections")
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl Connections {
    /// An idle connection to one of `addresses` (in their order) for `provider` and `target`,
    /// taken out of the pool: the caller waits until it is ready for a request (it may still be
    /// finishing the response it was returned after) and drops it if it is not.
    pub(crate) fn checkout(
        &self,
        provider: &str,
        target: &Target,
        addresses: &[IpAddr],
    ) -> Option<(Key, SendRequest<WasiBody>)> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        for ip in addresses {
            let key = Key::new(provider, target, *ip);
            let Some(list) = idle.get_mut(&key) else {
                continue;
            };
            while let Some(entry) = list.pop() {
                if now.duration_since(entry.since) < IDLE_TIMEOUT && !entry.sender.is_closed() {
                    return Some((key, entry.sender));
                }
            }
            idle.remove(&key);
        }
        None
    }

    /// Keeps `sender` for the next request to `key`, if it can take one and there is room.
    pub(crate) fn checkin(&self, key: Key, sender: SendRequest<WasiBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        idle.retain(|_, list| {
            list.retain(|e| now.duration_since(e.since) < IDLE_TIMEOUT && !e.sender.is_closed());
            !list.is_empty()
        });
        let total: usize = idle.values().map(Vec::len).sum();
        let list = idle.entry(key).or_default();
        if total < MAX_IDLE && list.len() < MAX_IDLE_PER_KEY {
            list.push(Idle { sender, since: now });
        }
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum()
    }
}

/// Gives a connection back to its pool when the response that used it was read to the end.
pub(crate) struct Checkin {
    pub pool: Connections,
    pub key: Key,
    pub sender: SendRequest<WasiBody>,
}

impl Checkin {
    pub(crate) fn finish(self) {
        self.pool.checkin(self.key, self.sender);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use wasmtime_wasi_http::RequestOptions;

    use super::*;
    use crate::egress::connect::{self, Reuse};

    /// A loopback HTTP/1.1 server answering every request on a connection with `response`,
    /// closing after it when `close`; counts the connections it accepted.
    async fn server(response: &'static str, close: bool) -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            if socket.write_all(response.as_bytes()).await.is_err() || close {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (port, accepted)
    }

    fn target(port: u16) -> Target {
        Target {
            scheme: Scheme::Http,
            host: HostKind::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            port,
        }
    }

    /// One GET; reads the body to the end when `read`.
    async fn get(pool: &Connections, provider: &str, port: u16, read: bool) {
        let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
            .body(
                Empty::<Bytes>::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .unwrap();
        let options = RequestOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            first_byte_timeout: Some(Duration::from_secs(5)),
            between_bytes_timeout: Some(Duration::from_secs(5)),
        };
        let reuse = Reuse { pool, provider };
        let (response, _io) = connect::send(
            request,
            &target(port),
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            options,
            &reuse,
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
        if read {
            response.into_body().collect().await.unwrap();
        }
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    #[tokio::test]
    async fn connections_are_reused_per_destination_and_provider() {
        let (port, accepted) = server(OK, false).await;
        let pool = Connections::default();
        for _ in 0..3 {
            get(&pool, "a", port, true).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
        // Another ProviderConfig never takes a's connection, nor does another pool.
        get(&pool, "b", port, true).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        get(&Connections::default(), "a", port, true).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(pool.idle_count(), 2);
    }

    #[tokio::test]
    async fn a_connection_is_not_reused_after_close_or_an_unread_body() {
        let closing = "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
        let (port, accepted) = server(closing, true).await;
        let pool = Connections::default();
        get(&pool, "a", port, true).await;
        get(&pool, "a", port, true).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);

        // A body nobody read to its end leaves its connection unusable: not kept.
        let long = "HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\nok";
        let (port, accepted) = server(long, false).await;
        get(&pool, "a", port, false).await;
        get(&pool, "a", port, false).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
