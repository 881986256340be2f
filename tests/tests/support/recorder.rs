//! A loopback HTTP server that records every request it gets (head and body, as text) and
//! answers each with one fixed response: what a plugin managed to send, seen from outside.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One recorded request: the head (request line and headers) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub head: String,
    pub body: String,
}

impl Recorded {
    /// Every value of header `name` (case-insensitive).
    pub fn headers(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    }
}

/// A running recorder on `127.0.0.1:port`.
#[derive(Debug, Clone)]
pub struct Recorder {
    pub port: u16,
    seen: Arc<Mutex<Vec<Recorded>>>,
}

impl Recorder {
    /// Answers `200 OK` with body `ok`.
    pub async fn start() -> std::io::Result<Recorder> {
        Self::answering("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await
    }

    /// Answers `302 Found` to `location`.
    pub async fn redirecting(location: &str) -> std::io::Result<Recorder> {
        let answer = format!(
            "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        Self::answering(&answer).await
    }

    async fn answering(answer: &str) -> std::io::Result<Recorder> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answer = answer.as_bytes().to_vec();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let log = log.clone();
                let answer = answer.clone();
                tokio::spawn(async move {
                    if let Some(recorded) = read_request(&mut socket).await {
                        log.lock().unwrap_or_else(|e| e.into_inner()).push(recorded);
                    }
                    let _ = socket.write_all(&answer).await;
                });
            }
        });
        Ok(Recorder { port, seen })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `http://127.0.0.1:<port>`: the allowlist entry.
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Reads one request: head up to the blank line, then `content-length` bytes of body.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Recorded> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(buf.get(..n).unwrap_or_default());
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let head = String::from_utf8_lossy(raw.get(..head_end).unwrap_or_default()).into_owned();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = raw.get(head_end + 4..).unwrap_or_default().to_vec();
    while body.len() < length {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(buf.get(..n).unwrap_or_default());
    }
    Some(Recorded {
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
