//! A loopback HTTP server that holds its one answer until the test releases it: keeps a plugin
//! call in flight for exactly as long as a test needs, without sleeping.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// One pending request: `accepted` fires when it arrived, sending on `release` answers `200 ok`.
#[derive(Debug)]
pub struct Gated {
    pub port: u16,
    pub accepted: oneshot::Receiver<()>,
    pub release: oneshot::Sender<()>,
}

/// Binds `127.0.0.1:0` and serves one request in the background.
pub async fn serve() -> std::io::Result<Gated> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (accepted_tx, accepted) = oneshot::channel();
    let (release, released) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let mut buf = [0u8; 4096];
        let _ = socket.read(&mut buf).await;
        let _ = accepted_tx.send(());
        let _ = released.await;
        let _ = socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            .await;
    });
    Ok(Gated {
        port,
        accepted,
        release,
    })
}
