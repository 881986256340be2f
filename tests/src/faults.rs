//! A fault-injecting HTTP proxy between a plugin and moto, switchable while it runs.
//!
//! The ProviderConfig's `endpoint` and `allowedHosts` name [`FaultProxy::endpoint`]; the proxy
//! forwards to moto. Each request is an EC2 (or STS) Query API call: a form-encoded POST with
//! `Action=...` in the body, its service named by the credential scope of its SigV4
//! `Authorization` header. The test sets [`Rule`]s at any time ([`FaultProxy::set`],
//! [`FaultProxy::heal`]); the first rule that applies to a request decides what happens to it
//! ([`Fault`]), and a request no rule applies to passes through. Rules apply to EC2 calls only,
//! unless they name an action of another service: STS `GetCallerIdentity` (the plugin's
//! `location`) passes through.
//!
//! Every request is recorded ([`Record`]: when, which call, what was done), so tests assert on
//! what reached the cloud. Ids of the instances `RunInstances` made (even when its answer was
//! dropped) are remembered, which is what [`Fault::NotFoundForNew`] needs.
//!
//! The proxy runs on its own thread and runtime: it keeps answering while the test blocks, and
//! stops (closing every connection it holds) when dropped. One request per connection: every
//! answer says `Connection: close`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Bound on a request (head and body) from the plugin.
const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Bound on an answer from moto.
const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// Bound on one exchange with moto, so a wedged moto cannot wedge the proxy.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`FaultProxy::wait_records`] looks again.
const POLL: Duration = Duration::from_millis(50);
/// The service of a call without a SigV4 scope.
const DEFAULT_SERVICE: &str = "ec2";

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("failed to bind the fault proxy on loopback")]
    Bind(#[source] io::Error),
    #[error("failed to start the fault proxy's thread")]
    Thread(#[source] io::Error),
    #[error("the fault proxy never saw {what} within {timeout:?}; its records:\n{records}")]
    Timeout {
        what: String,
        timeout: Duration,
        records: String,
    },
}

/// What a connection that is cut does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Keep the connection open without answering, until the client gives up.
    Hold,
    /// Reset it (`SO_LINGER` 0, then close: the client reads `ECONNRESET`).
    Reset,
}

/// What to do with a request a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Forward it and relay the answer (a rule that shields a request from later rules).
    PassThrough,
    /// Forward it (moto acts on it), then drop the answer.
    DropResponse(Cut),
    /// Answer `InvalidInstanceID.NotFound` (HTTP 400) to a call naming (`InstanceId.N`) an
    /// instance made through this proxy less than this long ago, as EC2 does right after
    /// `RunInstances`. Applies to no other request.
    NotFoundForNew(Duration),
    /// Answer this HTTP status with a plain-text body (no EC2 error code), optionally with
    /// `Retry-After: <seconds>`.
    Status {
        status: u16,
        retry_after: Option<u32>,
    },
    /// Answer an EC2 XML error with this HTTP status and code.
    Ec2Error { status: u16, code: String },
    /// Reset the connection without forwarding.
    Reset,
    /// Never answer, without forwarding (the connection stays open until the client leaves).
    Hang,
    /// Forward it after this long.
    Delay(Duration),
}

impl Fault {
    /// EC2's throttling answer: `RequestLimitExceeded`, HTTP 503.
    pub fn request_limit_exceeded() -> Fault {
        Fault::Ec2Error {
            status: 503,
            code: "RequestLimitExceeded".to_owned(),
        }
    }

    /// Refused credentials: `AuthFailure`, HTTP 401.
    pub fn auth_failure() -> Fault {
        Fault::Ec2Error {
            status: 401,
            code: "AuthFailure".to_owned(),
        }
    }

    /// A plain HTTP error status without `Retry-After`.
    pub fn status(status: u16) -> Fault {
        Fault::Status {
            status,
            retry_after: None,
        }
    }
}

/// When a [`Fault`] applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Actions it applies to; empty: every EC2 action.
    pub actions: Vec<String>,
    pub fault: Fault,
    /// How many more requests it applies to; `None`: until replaced.
    pub remaining: Option<u32>,
}

impl Rule {
    /// `fault` for every EC2 call.
    pub fn every(fault: Fault) -> Rule {
        Rule {
            actions: Vec::new(),
            fault,
            remaining: None,
        }
    }

    /// `fault` for these actions only (of any service).
    pub fn on<S: AsRef<str>>(actions: &[S], fault: Fault) -> Rule {
        Rule {
            actions: actions.iter().map(|a| a.as_ref().to_owned()).collect(),
            fault,
            remaining: None,
        }
    }

    /// Applies to the next `n` requests it matches only.
    pub fn times(mut self, n: u32) -> Rule {
        self.remaining = Some(n);
        self
    }

    fn matches(&self, call: &Call, recent: &dyn Fn(&str, Duration) -> bool) -> bool {
        if self.remaining == Some(0) {
            return false;
        }
        let action_matches = if self.actions.is_empty() {
            call.service == DEFAULT_SERVICE
        } else {
            self.actions.contains(&call.action)
        };
        action_matches
            && match &self.fault {
                Fault::NotFoundForNew(window) => {
                    call.instance_ids().iter().any(|id| recent(id, *window))
                }
                _ => true,
            }
    }
}

/// What the proxy did with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Forwarded; moto answered `status`, relayed.
    Forwarded { status: u16 },
    /// Forwarded after a [`Fault::Delay`]; relayed.
    Delayed { status: u16 },
    /// Forwarded; moto answered `status`; the answer was dropped.
    ResponseDropped { status: u16, cut: Cut },
    /// Answered by the proxy, not forwarded.
    Answered { status: u16, code: Option<String> },
    /// Reset, not forwarded.
    Reset,
    /// Never answered, not forwarded.
    Hung,
    /// moto could not be reached or answered garbage (the client got a 502).
    UpstreamFailed(String),
    /// Not an HTTP request the proxy understands (the client got a 400).
    Malformed(String),
}

/// One request the proxy saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When its head arrived.
    pub at: Instant,
    /// `ec2`, `sts`, ... (from the SigV4 credential scope).
    pub service: String,
    pub action: String,
    /// The form parameters, `Action` and `Version` included.
    pub params: Vec<(String, String)>,
    pub outcome: Outcome,
    /// Instance ids in moto's answer to `RunInstances` (whether relayed or dropped).
    pub created: Vec<String>,
}

impl Record {
    pub fn param(&self, name: &str) -> Option<&str> {
        param(&self.params, name)
    }

    /// The `InstanceId.N` parameters.
    pub fn instance_ids(&self) -> Vec<&str> {
        instance_ids(&self.params)
    }

    /// The value of launch tag `key` (`TagSpecification.N.Tag.M.Key` = `key`).
    pub fn tag(&self, key: &str) -> Option<&str> {
        tag(&self.params, key)
    }

    /// Whether a fault changed what the client got (anything but a plain pass-through).
    pub fn faulted(&self) -> bool {
        !matches!(self.outcome, Outcome::Forwarded { .. })
    }
}

/// A request as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub at: Instant,
    pub action: String,
}

/// A running proxy; stopped when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `upstream` (moto), passing everything
    /// through until rules are set.
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy, ProxyError> {
        let listener = StdListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(ProxyError::Bind)?;
        listener.set_nonblocking(true).map_err(ProxyError::Bind)?;
        let addr = listener.local_addr().map_err(ProxyError::Bind)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ProxyError::Thread)?;
        let shared = Arc::new(Shared {
            upstream,
            rules: Mutex::new(Vec::new()),
            records: Mutex::new(Vec::new()),
            arrivals: Mutex::new(Vec::new()),
            created: Mutex::new(Vec::new()),
        });
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        () = accept_loop(listener, serving) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here closes every connection still held.
            })
            .map_err(ProxyError::Thread)?;
        Ok(FaultProxy {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// A proxy forwarding to the moto on `port` of loopback.
    pub fn to_port(port: u16) -> Result<FaultProxy, ProxyError> {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }

    /// `http://127.0.0.1:<port>`: the ProviderConfig's endpoint and allowlist entry.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the rules.
    pub fn set(&self, rules: impl IntoIterator<Item = Rule>) {
        *lock(&self.shared.rules) = rules.into_iter().collect();
    }

    /// Adds a rule after the current ones.
    pub fn push(&self, rule: Rule) {
        lock(&self.shared.rules).push(rule);
    }

    /// Removes every rule: everything passes through from now on.
    pub fn heal(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Every request seen so far, oldest first.
    pub fn records(&self) -> Vec<Record> {
        lock(&self.shared.records).clone()
    }

    /// Every request as it arrived, before anything was done with it (a held or delayed
    /// request is here while it is in flight, and in [`Self::records`] only once done).
    pub fn arrivals(&self) -> Vec<Arrival> {
        lock(&self.shared.arrivals).clone()
    }

    /// Ids of every instance `RunInstances` made through this proxy.
    pub fn created_ids(&self) -> Vec<String> {
        lock(&self.shared.created)
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Polls the records until `condition` holds, for at most `timeout`.
    pub async fn wait_records(
        &self,
        what: &str,
        timeout: Duration,
        condition: impl Fn(&[Record]) -> bool,
    ) -> Result<Vec<Record>, ProxyError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let records = self.records();
            if condition(&records) {
                return Ok(records);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProxyError::Timeout {
                    what: what.to_owned(),
                    timeout,
                    records: summary(&records),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // An error means the thread already ended.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the proxy thread has nothing left to report here.
            let _ = thread.join();
        }
    }
}

/// One line per record: seconds since the first, service, action, ids, outcome.
pub fn summary(records: &[Record]) -> String {
    let start = records.first().map(|r| r.at);
    records
        .iter()
        .map(|r| {
            let t = start.map_or(0.0, |s| r.at.saturating_duration_since(s).as_secs_f64());
            format!(
                "{t:8.3}s {}:{} {:?} {:?}",
                r.service,
                r.action,
                r.instance_ids(),
                r.outcome
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    rules: Mutex<Vec<Rule>>,
    records: Mutex<Vec<Record>>,
    /// Every request as it arrived (records are written when it is done with).
    arrivals: Mutex<Vec<Arrival>>,
    /// Instances made through the proxy, with when their `RunInstances` was answered.
    created: Mutex<Vec<(String, Instant)>>,
}

impl Shared {
    /// The fault for `call` (using up one application of a counted rule), if a rule applies.
    fn fault_for(&self, call: &Call) -> Option<Fault> {
        let now = Instant::now();
        let recent = |id: &str, window: Duration| {
            lock(&self.created)
                .iter()
                .any(|(made, at)| made == id && now.saturating_duration_since(*at) < window)
        };
        let mut rules = lock(&self.rules);
        let rule = rules.iter_mut().find(|r| r.matches(call, &recent))?;
        if let Some(n) = &mut rule.remaining {
            *n = n.saturating_sub(1);
        }
        Some(rule.fault.clone())
    }

    fn record(&self, at: Instant, call: Call, outcome: Outcome, created: Vec<String>) {
        lock(&self.records).push(Record {
            at,
            service: call.service,
            action: call.action,
            params: call.params,
            outcome,
            created,
        });
    }

    fn remember_created(&self, ids: &[String]) {
        let now = Instant::now();
        lock(&self.created).extend(ids.iter().map(|id| (id.clone(), now)));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve(stream, Arc::clone(&shared)));
            }
            // Out of descriptors or an aborted handshake: the next accept may work.
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Serves one request on `stream`.
async fn serve(mut stream: TcpStream, shared: Arc<Shared>) {
    let request = match read_request(&mut stream).await {
        Ok(Some(request)) => request,
        // The client left before sending a whole request.
        Ok(None) => return,
        Err(error) => {
            let call = Call::default();
            shared.record(
                Instant::now(),
                call,
                Outcome::Malformed(error.to_string()),
                Vec::new(),
            );
            let answer = Answer::text(400, &error.to_string());
            // The client may be gone; nothing to do about it.
            let _ = stream.write_all(&answer.to_bytes()).await;
            return;
        }
    };
    let at = Instant::now();
    let call = Call::of(&request);
    lock(&shared.arrivals).push(Arrival {
        at,
        action: call.action.clone(),
    });
    let fault = shared.fault_for(&call).unwrap_or(Fault::PassThrough);
    match fault {
        Fault::PassThrough | Fault::Delay(_) => {
            let delayed = match fault {
                Fault::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    true
                }
                _ => false,
            };
            match forward(shared.upstream, &request).await {
                Ok(response) => {
                    let created = created_ids(&call, &response);
                    shared.remember_created(&created);
                    let status = response.status;
                    let outcome = if delayed {
                        Outcome::Delayed { status }
                    } else {
                        Outcome::Forwarded { status }
                    };
                    shared.record(at, call, outcome, created);
                    let _ = stream.write_all(&Answer::relay(response).to_bytes()).await;
                }
                Err(error) => {
                    shared.record(at, call, Outcome::UpstreamFailed(error.clone()), Vec::new());
                    let answer = Answer::text(502, &format!("fault proxy: {error}"));
                    let _ = stream.write_all(&answer.to_bytes()).await;
                }
            }
        }
        Fault::DropResponse(cut) => match forward(shared.upstream, &request).await {
            Ok(response) => {
                let created = created_ids(&call, &response);
                shared.remember_created(&created);
                let outcome = Outcome::ResponseDropped {
                    status: response.status,
                    cut,
                };
                shared.record(at, call, outcome, created);
                cut_connection(stream, cut).await;
            }
            Err(error) => {
                shared.record(at, call, Outcome::UpstreamFailed(error), Vec::new());
                cut_connection(stream, cut).await;
            }
        },
        Fault::NotFoundForNew(_) => {
            let ids = call.instance_ids().join(", ");
            let message = format!("The instance ID '{ids}' does not exist");
            let answer = Answer::ec2_error(400, "InvalidInstanceID.NotFound", &message);
            shared.record(at, call, answer.outcome(), Vec::new());
            let _ = stream.write_all(&answer.to_bytes()).await;
        }
        Fault::Status {
            status,
            retry_after,
        } => {
            let mut answer = Answer::text(status, "injected by the fault proxy");
            if let Some(seconds) = retry_after {
                answer
                    .headers
                    .push(("Retry-After".to_owned(), seconds.to_string()));
            }
            shared.record(at, call, answer.outcome(), Vec::new());
            let _ = stream.write_all(&answer.to_bytes()).await;
        }
        Fault::Ec2Error { status, code } => {
            let answer = Answer::ec2_error(status, &code, "injected by the fault proxy");
            shared.record(at, call, answer.outcome(), Vec::new());
            let _ = stream.write_all(&answer.to_bytes()).await;
        }
        Fault::Reset => {
            shared.record(at, call, Outcome::Reset, Vec::new());
            cut_connection(stream, Cut::Reset).await;
        }
        Fault::Hang => {
            shared.record(at, call, Outcome::Hung, Vec::new());
            cut_connection(stream, Cut::Hold).await;
        }
    }
}

async fn cut_connection(mut stream: TcpStream, cut: Cut) {
    match cut {
        Cut::Reset => {
            // If it fails, the close below is an orderly one: still no answer.
            let _ = stream.set_zero_linger();
            drop(stream);
        }
        Cut::Hold => {
            // Read (and ignore) until the client closes or the proxy stops.
            let mut scratch = [0u8; 1024];
            while let Ok(n) = stream.read(&mut scratch).await {
                if n == 0 {
                    break;
                }
            }
        }
    }
}

/// Reads one request; `None` if the connection closed before a whole one arrived.
async fn read_request(stream: &mut TcpStream) -> Result<Option<Request>, WireError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some((request, _)) = parse_request(&buf)? {
            return Ok(Some(request));
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return Err(WireError::TooLarge);
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| WireError::Closed)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// Sends `request` to moto (one connection, `Connection: close`) and reads its whole answer.
async fn forward(upstream: SocketAddr, request: &Request) -> Result<Response, String> {
    let exchange = async {
        let mut stream = TcpStream::connect(upstream)
            .await
            .map_err(|e| format!("connect to {upstream}: {e}"))?;
        stream
            .write_all(&request.to_upstream_bytes())
            .await
            .map_err(|e| format!("send to {upstream}: {e}"))?;
        let mut raw = Vec::new();
        (&mut stream)
            .take(u64::try_from(MAX_RESPONSE_BYTES).unwrap_or(u64::MAX))
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read from {upstream}: {e}"))?;
        parse_response(&raw).map_err(|e| format!("answer from {upstream}: {e}"))
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{upstream} did not answer within {UPSTREAM_TIMEOUT:?}"
            ))
        })
}

/// Ids of the instances a `RunInstances` answer names.
fn created_ids(call: &Call, response: &Response) -> Vec<String> {
    if call.action != "RunInstances" || !(200..300).contains(&response.status) {
        return Vec::new();
    }
    elements(&String::from_utf8_lossy(&response.body), "instanceId")
}

// ---- the wire: just enough HTTP/1.1 and Query API for the proxy (pure, unit-tested) ----

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message is not HTTP/1.x: {0}")]
    Syntax(String),
    #[error("bad chunked encoding")]
    Chunked,
    #[error("the body is shorter than its Content-Length")]
    Truncated,
    #[error("the message is too large")]
    TooLarge,
    #[error("the connection failed")]
    Closed,
}

/// One HTTP request, its body de-chunked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The request as sent on to moto: same head minus hop-by-hop headers, a Content-Length
    /// body, `Connection: close`. `Host` is kept, since the SigV4 signature covers it.
    fn to_upstream_bytes(&self) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        for (name, value) in self.headers.iter().filter(|(n, _)| !is_framing(n)) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// One HTTP response, its body de-chunked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Headers about the framing of one hop, which the proxy sets itself.
fn is_framing(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "proxy-connection",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Splits `buf` at the end of its head (`\r\n\r\n`): head text and the rest, or `None` if the
/// head is not complete yet.
fn split_head(buf: &[u8]) -> Result<Option<(&str, &[u8])>, WireError> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = buf.get(..end).unwrap_or_default();
    let rest = buf.get(end + 4..).unwrap_or_default();
    let head = std::str::from_utf8(head).map_err(|_| WireError::Syntax("head not UTF-8".into()))?;
    Ok(Some((head, rest)))
}

fn parse_headers<'a>(
    lines: impl Iterator<Item = &'a str>,
) -> Result<Vec<(String, String)>, WireError> {
    lines
        .map(|line| {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| WireError::Syntax(format!("header line {line:?}")))?;
            Ok((name.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    header(headers, "transfer-encoding").is_some_and(|te| {
        te.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("chunked"))
    })
}

fn content_length(headers: &[(String, String)]) -> Result<Option<usize>, WireError> {
    header(headers, "content-length")
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| WireError::Syntax(format!("Content-Length {v:?}")))
        })
        .transpose()
}

/// Parses one request from the start of `buf`: the request and the bytes it took, or `None`
/// if `buf` does not hold a whole request yet.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, WireError> {
    let Some((head, rest)) = split_head(buf)? else {
        return Ok(None);
    };
    let head_len = buf.len() - rest.len();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(WireError::Syntax(format!("request line {request_line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(WireError::Syntax(format!("version {version:?}")));
    }
    let headers = parse_headers(lines)?;
    let (body, body_len) = if is_chunked(&headers) {
        match decode_chunked(rest)? {
            Some(decoded) => decoded,
            None => return Ok(None),
        }
    } else {
        let len = content_length(&headers)?.unwrap_or(0);
        match rest.get(..len) {
            Some(body) => (body.to_vec(), len),
            None => return Ok(None),
        }
    };
    let request = Request {
        method: method.to_owned(),
        target: target.to_owned(),
        headers,
        body,
    };
    Ok(Some((request, head_len + body_len)))
}

/// Parses a whole response (the connection closed after it).
pub fn parse_response(buf: &[u8]) -> Result<Response, WireError> {
    let (head, rest) = split_head(buf)?.ok_or(WireError::Truncated)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| version.starts_with("HTTP/1."))
        .ok_or_else(|| WireError::Syntax(format!("status line {status_line:?}")))?;
    let headers = parse_headers(lines)?;
    let body = if is_chunked(&headers) {
        decode_chunked(rest)?.ok_or(WireError::Chunked)?.0
    } else {
        match content_length(&headers)? {
            Some(len) => rest.get(..len).ok_or(WireError::Truncated)?.to_vec(),
            None => rest.to_vec(),
        }
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Decodes a chunked body at the start of `buf`: the body and the bytes it took (trailers
/// included), or `None` if it is not complete yet.
pub fn decode_chunked(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, WireError> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(rest.get(..line_end).unwrap_or_default())
            .map_err(|_| WireError::Chunked)?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| WireError::Chunked)?;
        pos += line_end + 2;
        if size == 0 {
            // Trailers, then an empty line.
            loop {
                let rest = buf.get(pos..).unwrap_or_default();
                let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
                    return Ok(None);
                };
                pos += end + 2;
                if end == 0 {
                    return Ok(Some((body, pos)));
                }
            }
        }
        if body.len().saturating_add(size) > MAX_REQUEST_BYTES.max(MAX_RESPONSE_BYTES) {
            return Err(WireError::TooLarge);
        }
        let Some(data) = buf.get(pos..pos + size) else {
            return Ok(None);
        };
        body.extend_from_slice(data);
        pos += size;
        match buf.get(pos..pos + 2) {
            Some(b"\r\n") => pos += 2,
            Some(_) => return Err(WireError::Chunked),
            None => return Ok(None),
        }
    }
}

/// A form-encoded body as name/value pairs (`+` is a space, `%XX` a byte), in order.
pub fn parse_form(body: &[u8]) -> Vec<(String, String)> {
    body.split(|&b| b == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let mut halves = pair.splitn(2, |&b| b == b'=');
            let name = halves.next().unwrap_or_default();
            let value = halves.next().unwrap_or_default();
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(decoded) => {
                        out.push(decoded);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The service of a SigV4 `Authorization` header: `Credential=<key>/<date>/<region>/<service>/...`.
pub fn scope_service(authorization: &str) -> Option<&str> {
    let credential = authorization
        .split([',', ' '])
        .map(str::trim)
        .find_map(|part| part.strip_prefix("Credential="))?;
    credential.split('/').nth(3).filter(|s| !s.is_empty())
}

/// One Query API call, as the proxy understands a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Call {
    pub service: String,
    pub action: String,
    pub params: Vec<(String, String)>,
}

impl Call {
    pub fn of(request: &Request) -> Call {
        let mut params = parse_form(&request.body);
        // Query parameters in the URL count too (a GET-style call).
        if let Some((_, query)) = request.target.split_once('?') {
            params.extend(parse_form(query.as_bytes()));
        }
        let action = param(&params, "Action").unwrap_or_default().to_owned();
        let service = request
            .header("authorization")
            .and_then(scope_service)
            .map(str::to_owned)
            .unwrap_or_else(|| match action.as_str() {
                "GetCallerIdentity" | "AssumeRole" => "sts".to_owned(),
                _ => DEFAULT_SERVICE.to_owned(),
            });
        Call {
            service,
            action,
            params,
        }
    }

    pub fn instance_ids(&self) -> Vec<&str> {
        instance_ids(&self.params)
    }
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn instance_ids(params: &[(String, String)]) -> Vec<&str> {
    params
        .iter()
        .filter(|(n, _)| {
            n.strip_prefix("InstanceId.")
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|(_, v)| v.as_str())
        .collect()
}

fn tag<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params.iter().find_map(|(name, value)| {
        let prefix = name.strip_suffix(".Key").filter(|_| value == key)?;
        if !prefix.starts_with("TagSpecification.") {
            return None;
        }
        param(params, &format!("{prefix}.Value"))
    })
}

/// The text of every `<name>…</name>` (flat elements; enough for moto's instance ids).
fn elements(xml: &str, name: &str) -> Vec<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = rest.get(start + open.len()..).unwrap_or_default();
        let Some(end) = after.find(&close) else { break };
        let text = after.get(..end).unwrap_or_default().trim();
        if !found.iter().any(|f| f == text) {
            found.push(text.to_owned());
        }
        rest = after.get(end + close.len()..).unwrap_or_default();
    }
    found
}

/// An answer the proxy writes to the client.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    code: Option<String>,
}

impl Answer {
    fn text(status: u16, text: &str) -> Answer {
        Answer {
            status,
            headers: vec![("Content-Type".to_owned(), "text/plain".to_owned())],
            body: text.as_bytes().to_vec(),
            code: None,
        }
    }

    /// EC2's error document (`Response/Errors/Error/{Code,Message}`).
    fn ec2_error(status: u16, code: &str, message: &str) -> Answer {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}\
             </Code><Message>{}</Message></Error></Errors><RequestID>fault-proxy</RequestID>\
             </Response>",
            xml_escape(message)
        );
        Answer {
            status,
            headers: vec![("Content-Type".to_owned(), "text/xml".to_owned())],
            body: body.into_bytes(),
            code: Some(code.to_owned()),
        }
    }

    fn relay(response: Response) -> Answer {
        Answer {
            status: response.status,
            headers: response
                .headers
                .into_iter()
                .filter(|(n, _)| !is_framing(n))
                .collect(),
            body: response.body,
            code: None,
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome::Answered {
            status: self.status,
            code: self.code.clone(),
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIGNED: &str = "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/ec2/aws4_request, \
                          SignedHeaders=content-type;host;x-amz-date, Signature=00";

    fn request(headers: &str, body: &str) -> Vec<u8> {
        format!("POST / HTTP/1.1\r\nhost: 127.0.0.1:9\r\n{headers}\r\n{body}").into_bytes()
    }

    #[test]
    fn parses_a_content_length_request_and_what_follows() {
        let body = "Action=DescribeInstances&Version=2016-11-15&InstanceId.1=i-1";
        let mut bytes = request(
            &format!(
                "authorization: {SIGNED}\r\ncontent-length: {}\r\n",
                body.len()
            ),
            body,
        );
        let whole = bytes.len();
        bytes.extend_from_slice(b"GET /next");
        let (parsed, used) = parse_request(&bytes).unwrap().unwrap();
        assert_eq!(used, whole);
        assert_eq!(parsed.method, "POST");
        assert_eq!(parsed.body, body.as_bytes());
        let call = Call::of(&parsed);
        assert_eq!(call.service, "ec2");
        assert_eq!(call.action, "DescribeInstances");
        assert_eq!(call.instance_ids(), ["i-1"]);
    }

    #[test]
    fn waits_for_the_whole_head_and_body() {
        let full = request("content-length: 10\r\n", "Action=Run");
        for cut in [10, full.len() - 4, full.len() - 1] {
            assert_eq!(
                parse_request(full.get(..cut).unwrap()).unwrap(),
                None,
                "{cut}"
            );
        }
        assert!(parse_request(&full).unwrap().is_some());
    }

    #[test]
    fn decodes_chunked_bodies_with_extensions_and_trailers() {
        let chunked = "transfer-encoding: chunked\r\n";
        let body = "7\r\nAction=\r\n8;ext=1\r\nRunInsta\r\n5\r\nnces&\r\n0\r\nx-trailer: 1\r\n\r\n";
        let bytes = request(chunked, body);
        let (parsed, used) = parse_request(&bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(parsed.body, b"Action=RunInstances&");
        assert_eq!(Call::of(&parsed).action, "RunInstances");
        // Incomplete: the last chunk has not arrived.
        let partial = request(chunked, "7\r\nAction=\r\n");
        assert_eq!(parse_request(&partial).unwrap(), None);
        assert_eq!(
            parse_request(&request(chunked, "zz\r\n")),
            Err(WireError::Chunked)
        );
    }

    #[test]
    fn rejects_what_is_not_http() {
        assert!(matches!(
            parse_request(b"HELLO\r\n\r\n"),
            Err(WireError::Syntax(_))
        ));
        assert!(matches!(
            parse_request(b"POST / HTTP/2\r\n\r\n"),
            Err(WireError::Syntax(_))
        ));
        assert!(matches!(
            parse_request(b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n"),
            Err(WireError::Syntax(_))
        ));
    }

    #[test]
    fn decodes_forms() {
        let form =
            parse_form(b"Action=RunInstances&Filter.1.Name=tag%3Avmop.dev%2Fuid&a=b+c&e=&%zz");
        assert_eq!(
            form,
            [
                ("Action", "RunInstances"),
                ("Filter.1.Name", "tag:vmop.dev/uid"),
                ("a", "b c"),
                ("e", ""),
                ("%zz", ""),
            ]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn tells_sts_from_ec2() {
        let sts = SIGNED.replace("/ec2/", "/sts/");
        assert_eq!(scope_service(&sts), Some("sts"));
        assert_eq!(scope_service("Bearer x"), None);
        let body = "Action=GetCallerIdentity&Version=2011-06-15";
        let unsigned = request(&format!("content-length: {}\r\n", body.len()), body);
        let call = Call::of(&parse_request(&unsigned).unwrap().unwrap().0);
        assert_eq!(
            (call.service.as_str(), call.action.as_str()),
            ("sts", "GetCallerIdentity")
        );
    }

    #[test]
    fn finds_launch_tags_and_instance_ids() {
        let params = parse_form(
            b"Action=RunInstances&TagSpecification.1.Tag.1.Key=Name&TagSpecification.1.Tag.1.Value=web\
              &TagSpecification.1.Tag.2.Key=vmop.dev%2Fuid&TagSpecification.1.Tag.2.Value=u-1\
              &InstanceId.1=i-1&InstanceId.2=i-2&InstanceId.x=no",
        );
        assert_eq!(tag(&params, "vmop.dev/uid"), Some("u-1"));
        assert_eq!(tag(&params, "missing"), None);
        assert_eq!(instance_ids(&params), ["i-1", "i-2"]);
    }

    #[test]
    fn reads_responses_of_every_framing() {
        let xml = "<r><instanceId>i-1</instanceId><x><instanceId>i-1</instanceId></x></r>";
        let sized = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{xml}",
            xml.len()
        );
        let parsed = parse_response(sized.as_bytes()).unwrap();
        assert_eq!(parsed.status, 200);
        assert_eq!(
            elements(&String::from_utf8_lossy(&parsed.body), "instanceId"),
            ["i-1"]
        );
        let chunked = "HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n\
                       3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked.as_bytes()).unwrap().body, b"abc");
        let closed = "HTTP/1.0 500 INTERNAL SERVER ERROR\r\nServer: x\r\n\r\nuntil eof";
        let parsed = parse_response(closed.as_bytes()).unwrap();
        assert_eq!(
            (parsed.status, parsed.body.as_slice()),
            (500, b"until eof".as_slice())
        );
        let short = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
        assert_eq!(parse_response(short.as_bytes()), Err(WireError::Truncated));
    }

    #[test]
    fn rules_match_by_action_service_count_and_age() {
        let call = |service: &str, action: &str, id: Option<&str>| Call {
            service: service.to_owned(),
            action: action.to_owned(),
            params: id
                .map(|id| vec![("InstanceId.1".to_owned(), id.to_owned())])
                .unwrap_or_default(),
        };
        let never = |_: &str, _: Duration| false;
        let fresh = |id: &str, _: Duration| id == "i-new";
        let every = Rule::every(Fault::Hang);
        assert!(every.matches(&call("ec2", "RunInstances", None), &never));
        assert!(!every.matches(&call("sts", "GetCallerIdentity", None), &never));
        let sts = Rule::on(&["GetCallerIdentity"], Fault::Hang);
        assert!(sts.matches(&call("sts", "GetCallerIdentity", None), &never));
        let spent = Rule::every(Fault::Reset).times(0);
        assert!(!spent.matches(&call("ec2", "RunInstances", None), &never));
        let lag = Rule::on(
            &["DescribeInstances"],
            Fault::NotFoundForNew(Duration::from_secs(5)),
        );
        assert!(lag.matches(&call("ec2", "DescribeInstances", Some("i-new")), &fresh));
        assert!(!lag.matches(&call("ec2", "DescribeInstances", Some("i-old")), &fresh));
        assert!(!lag.matches(&call("ec2", "DescribeInstances", None), &fresh));
    }

    #[test]
    fn answers_ec2_errors_the_plugin_can_read() {
        let answer = Answer::ec2_error(400, "InvalidInstanceID.NotFound", "id 'i-<1>' & more");
        let bytes = answer.to_bytes();
        let parsed = parse_response(&bytes).unwrap();
        assert_eq!(parsed.status, 400);
        let body = String::from_utf8(parsed.body).unwrap();
        assert!(
            body.contains("<Code>InvalidInstanceID.NotFound</Code>"),
            "{body}"
        );
        assert!(body.contains("i-&lt;1&gt;' &amp; more"), "{body}");
        assert_eq!(header(&parsed.headers, "connection"), Some("close"));
    }

    #[test]
    fn forwards_without_hop_headers_but_with_host() {
        let bytes = request(
            "transfer-encoding: chunked\r\nx-amz-date: 1\r\n",
            "3\r\nabc\r\n0\r\n\r\n",
        );
        let (parsed, _) = parse_request(&bytes).unwrap().unwrap();
        let upstream = String::from_utf8(parsed.to_upstream_bytes()).unwrap();
        assert!(
            upstream.starts_with("POST / HTTP/1.1\r\nhost: 127.0.0.1:9\r\n"),
            "{upstream}"
        );
        assert!(!upstream.contains("chunked"), "{upstream}");
        assert!(
            upstream.ends_with("Content-Length: 3\r\nConnection: close\r\n\r\nabc"),
            "{upstream}"
        );
    }

    /// The proxy end to end against a loopback stand-in for moto: pass-through, a counted
    /// fault, a dropped answer (moto still saw the call) and a reset.
    #[tokio::test]
    async fn switches_faults_at_run_time_and_records_everything() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_by_upstream = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let (mut s, _) = upstream.accept().await.unwrap();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let request = loop {
                    let n = s.read(&mut chunk).await.unwrap();
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some((r, _)) = parse_request(&buf).unwrap() {
                        break r;
                    }
                };
                lock(&seen_by_upstream).push(Call::of(&request).action);
                let body = "<r><instanceId>i-9</instanceId></r>";
                let answer = format!("HTTP/1.0 200 OK\r\n\r\n{body}");
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let proxy = FaultProxy::start(upstream_addr).unwrap();
        let send = |action: &'static str| {
            let addr = proxy.addr();
            async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let body = format!("Action={action}&InstanceId.1=i-9");
                let req = format!(
                    "POST / HTTP/1.1\r\nhost: x\r\nauthorization: {SIGNED}\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(req.as_bytes()).await.unwrap();
                let mut raw = Vec::new();
                match s.read_to_end(&mut raw).await {
                    Ok(_) => parse_response(&raw)
                        .map(|r| r.status)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.kind().to_string()),
                }
            }
        };
        assert_eq!(send("RunInstances").await, Ok(200));
        proxy.set([
            Rule::on(
                &["DescribeInstances"],
                Fault::NotFoundForNew(Duration::from_secs(60)),
            ),
            Rule::on(&["RunInstances"], Fault::DropResponse(Cut::Reset)).times(1),
            Rule::every(Fault::status(500)),
        ]);
        assert_eq!(send("DescribeInstances").await, Ok(400));
        assert!(
            send("RunInstances").await.is_err(),
            "the answer was not dropped"
        );
        assert_eq!(
            send("RunInstances").await,
            Ok(500),
            "a spent rule still applied"
        );
        proxy.set([Rule::every(Fault::Reset)]);
        assert!(send("TerminateInstances").await.is_err());
        proxy.heal();
        assert_eq!(send("TerminateInstances").await, Ok(200));

        let outcomes: Vec<_> = proxy.records().into_iter().map(|r| r.outcome).collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Forwarded { status: 200 },
                Outcome::Answered {
                    status: 400,
                    code: Some("InvalidInstanceID.NotFound".into())
                },
                Outcome::ResponseDropped {
                    status: 200,
                    cut: Cut::Reset
                },
                Outcome::Answered {
                    status: 500,
                    code: None
                },
                Outcome::Reset,
                Outcome::Forwarded { status: 200 },
            ]
        );
        assert_eq!(
            *lock(&seen),
            ["RunInstances", "RunInstances", "TerminateInstances"]
        );
        assert_eq!(proxy.created_ids(), ["i-9", "i-9"]);
        let arrived: Vec<_> = proxy.arrivals().into_iter().map(|a| a.action).collect();
        assert_eq!(
            arrived,
            [
                "RunInstances",
                "DescribeInstances",
                "RunInstances",
                "RunInstances",
                "TerminateInstances",
                "TerminateInstances"
            ]
        );
    }
}
