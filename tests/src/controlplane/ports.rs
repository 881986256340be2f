//! Free loopback ports.
//!
//! A probed port is only free at the moment of the probe: another process may take it before
//! the child binds it. Callers detect that from the child's log ([`is_bind_failure`]) and retry
//! with new ports.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};

/// Ports already handed out by this process, so two components never get the same one.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Returns a loopback TCP port that was free when probed and was not returned before by this
/// process.
pub fn free_port() -> io::Result<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    for _ in 0..64 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "the kernel kept returning loopback ports this process already used",
    ))
}

/// Whether a child's log says it could not bind its port (taken between probe and bind).
pub fn is_bind_failure(log: &str) -> bool {
    log.contains("address already in use")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice() -> io::Result<()> {
        let ports = (0..32)
            .map(|_| free_port())
            .collect::<io::Result<HashSet<_>>>()?;
        assert_eq!(ports.len(), 32);
        Ok(())
    }

    #[test]
    fn bind_failures_are_recognised_in_go_logs() {
        assert!(is_bind_failure(
            "failed to listen on 127.0.0.1:2379: listen tcp 127.0.0.1:2379: bind: address already in use"
        ));
        assert!(!is_bind_failure("etcd: ready to serve client requests"));
    }
}
