//! The "machines" backend on loopback: a tiny cloud with the plain-text API the `machines`
//! fixture guests speak (see `tests/fixtures/guests/machines/src/lib.rs`). It keeps state, so
//! the conformance suite can tell a correct guest from one that breaks one rule, and it
//! counts what is left, so a test can check the suite cleaned up.
//!
//! It knows one image, [`IMAGE`] (any other is 422), and checks the bearer token when
//! started with one (401 otherwise). Started with [`Backend::lagging`], it answers the first
//! reads of a new machine by id with 404, as an eventually consistent cloud does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

pub const IMAGE: &str = "img-1";

#[derive(Debug, Default)]
struct State {
    /// Live machines: id → uid.
    machines: BTreeMap<String, String>,
    next: u64,
    /// How many reads by id of a new machine answer 404.
    get_lag: u32,
    /// Machine id → reads by id that will still answer 404.
    unseen: BTreeMap<String, u32>,
}

/// A running backend; it stops when dropped.
#[derive(Debug)]
pub struct Backend {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Backend {
    /// Serves on a free loopback port; `token`: the bearer token every request must carry.
    pub async fn start(token: Option<&str>) -> std::io::Result<Backend> {
        Self::lagging(token, 0).await
    }

    /// Like [`Backend::start`], but the first `gets` reads by id of each new machine answer 404.
    pub async fn lagging(token: Option<&str>, gets: u32) -> std::io::Result<Backend> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State {
            get_lag: gets,
            ..State::default()
        }));
        let token = token.map(|t| format!("Bearer {t}"));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let state = shared.clone();
                let token = token.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, &state, token.as_deref()).await;
                });
            }
        });
        Ok(Backend {
            endpoint,
            state,
            task,
        })
    }

    /// Ids of the live machines.
    pub fn live(&self) -> Vec<String> {
        lock(&self.state).machines.keys().cloned().collect()
    }

    /// Machines ever created.
    pub fn created(&self) -> u64 {
        lock(&self.state).next
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One request per connection (`connection: close`).
async fn serve(
    socket: TcpStream,
    state: &Mutex<State>,
    token: Option<&str>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let (mut length, mut chunked, mut authorization) = (0usize, false, None);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).await? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "transfer-encoding" => chunked = value.trim().eq_ignore_ascii_case("chunked"),
                "authorization" => authorization = Some(value.trim().to_owned()),
                _ => {}
            }
        }
    }
    let body = if chunked {
        read_chunked(&mut reader).await?
    } else {
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await?;
        body
    };
    let (status, text) = if token.is_some() && authorization.as_deref() != token {
        (401, "bad token\n".to_owned())
    } else {
        answer(
            &mut lock(state),
            &method,
            &target,
            &String::from_utf8_lossy(&body),
        )
    };
    let response = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    reader.get_mut().write_all(response.as_bytes()).await
}

/// A `transfer-encoding: chunked` body (what wasi:http sends for a streamed body).
async fn read_chunked(reader: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).await?;
        let size = usize::from_str_radix(size.trim(), 16).map_err(std::io::Error::other)?;
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).await?;
        if size == 0 {
            return Ok(body);
        }
        body.extend(chunk.get(..size).unwrap_or_default());
    }
}

fn answer(state: &mut State, method: &str, target: &str, body: &str) -> (u16, String) {
    let row = |id: &str| format!("{id} running\n");
    match (method, target.strip_prefix("/machines")) {
        ("GET", Some(query)) if query.starts_with("?uid=") => {
            let uid = query.trim_start_matches("?uid=");
            let rows = state.machines.iter().filter(|(_, u)| *u == uid);
            (200, rows.map(|(id, _)| row(id)).collect())
        }
        ("POST", Some("")) => {
            let field = |name: &str| {
                body.split('&')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
                    .to_owned()
            };
            if field("image") != IMAGE {
                return (422, format!("no image {}\n", field("image")));
            }
            state.next += 1;
            let id = format!("m-{}", state.next);
            state.machines.insert(id.clone(), field("uid"));
            state.unseen.insert(id.clone(), state.get_lag);
            (201, row(&id))
        }
        ("GET", Some(path)) => match path.strip_prefix('/') {
            Some(id) if lagging(state, id) => (404, "no such machine\n".to_owned()),
            Some(id) if state.machines.contains_key(id) => (200, row(id)),
            _ => (404, "no such machine\n".to_owned()),
        },
        ("DELETE", Some(path)) => match path.strip_prefix('/') {
            Some(id) if state.machines.remove(id).is_some() => (204, String::new()),
            _ => (404, "no such machine\n".to_owned()),
        },
        _ => (400, format!("unknown request {method} {target}\n")),
    }
}

/// Whether this read of `id` is one of the 404s its lag still owes (and counts it).
fn lagging(state: &mut State, id: &str) -> bool {
    match state.unseen.get_mut(id) {
        Some(left) if *left > 0 => {
            *left -= 1;
            true
        }
        _ => false,
    }
}
