//! Bounded capture of a guest's stdout and stderr.
//!
//! A guest's output is kept in memory up to a byte cap per stream and per call; the rest is
//! counted and dropped. Writes never fail, so a chatty plugin is neither killed (Rust's `println!`
//! panics when stdout fails) nor able to grow the host's memory. After the call the sandbox logs
//! what was captured with the plugin's name.
//!
//! With a [`Redactor`] (set by the call's state), [`CapturedOutput::take`] returns the text with
//! every Secret value replaced. The buffer keeps the longest value's length beyond the cap, and
//! cuts at the cap only after redacting, so a value written across the cap is not kept in part
//! (`output::tests::a_secret_across_the_cap_is_not_kept_in_part`).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use vmop_contract::text::cut;

use super::redact::Redactor;

/// One captured stream. Cloning shares the buffer (the WASI context keeps one clone, the sandbox
/// another to read it after the call).
#[derive(Debug, Clone)]
pub(crate) struct CapturedOutput {
    inner: Arc<Mutex<Buffer>>,
}

#[derive(Debug)]
struct Buffer {
    bytes: Vec<u8>,
    cap: usize,
    dropped: u64,
    redactor: Redactor,
}

impl CapturedOutput {
    pub fn new(cap: usize) -> Self {
        CapturedOutput {
            inner: Arc::new(Mutex::new(Buffer {
                bytes: Vec::new(),
                cap,
                dropped: 0,
                redactor: Redactor::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A poisoned lock only means another writer panicked mid-append; the bytes are still
        // a valid (possibly shorter) capture.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces Secret values in what [`CapturedOutput::take`] returns (every clone shares it).
    pub fn set_redactor(&self, redactor: Redactor) {
        self.lock().redactor = redactor;
    }

    fn append(&self, data: &[u8]) {
        let mut buf = self.lock();
        let room = buf
            .cap
            .saturating_add(buf.redactor.max_len())
            .saturating_sub(buf.bytes.len());
        let (kept, dropped) = data.split_at(room.min(data.len()));
        buf.bytes.extend_from_slice(kept);
        buf.dropped = buf
            .dropped
            .saturating_add(u64::try_from(dropped.len()).unwrap_or(u64::MAX));
    }

    /// What was captured (lossily decoded, redacted, at most the cap) and how many bytes were
    /// dropped past the cap.
    pub fn take(&self) -> (String, u64) {
        let mut buf = self.lock();
        let raw = String::from_utf8_lossy(&buf.bytes).into_owned();
        let text = buf.redactor.string(raw);
        let kept = cut(&text, buf.cap);
        let cut = u64::try_from(text.len().saturating_sub(kept.len())).unwrap_or(u64::MAX);
        let kept = kept.to_owned();
        buf.bytes.clear();
        let dropped = std::mem::take(&mut buf.dropped).saturating_add(cut);
        (kept, dropped)
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Permit size offered to the guest per write; anything is accepted.
const WRITE_PERMIT: usize = 64 * 1024;

#[wasmtime_wasi::async_trait]
impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for CapturedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_up_to_the_cap_and_counts_the_rest() {
        let out = CapturedOutput::new(8);
        out.append(b"hello ");
        out.append(b"world");
        let (text, dropped) = out.take();
        assert_eq!(text, "hello wo");
        assert_eq!(dropped, 3);
        assert_eq!(out.take(), (String::new(), 0));
    }

    #[test]
    fn a_secret_across_the_cap_is_not_kept_in_part() {
        let out = CapturedOutput::new(8);
        out.set_redactor(Redactor::new(["SECRETVALUE"]));
        out.append(b"hello SECRETVALUE tail");
        let (text, dropped) = out.take();
        assert!(!text.contains("SECR"), "{text:?}");
        assert_eq!(text, "hello [r");
        assert!(dropped > 0);
        out.append(b"SECRETVALUE");
        assert_eq!(out.take().0, "[redacte");
    }
}
