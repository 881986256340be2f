//! etcd for one control plane: a single member on loopback, data in the control plane's
//! directory, fsync off (the data is thrown away).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::launch::{Component, LaunchError, Launched, args};

/// A running etcd and the URL its clients use.
#[derive(Debug)]
pub struct Etcd {
    pub launched: Launched,
    pub client_url: String,
}

pub async fn start(program: &Path, dir: &Path, timeout: Duration) -> Result<Etcd, LaunchError> {
    let data_dir = dir.join("etcd-data");
    let component = Component {
        name: "etcd",
        program,
        log: dir.join("etcd.log"),
        ports: 2,
        timeout,
    };
    let launched = component
        .launch(
            |ports| {
                let (client, peer) = (url(ports, 0), url(ports, 1));
                args([
                    "--name=default".to_owned(),
                    format!("--data-dir={}", data_dir.display()),
                    format!("--listen-client-urls={client}"),
                    format!("--advertise-client-urls={client}"),
                    format!("--listen-peer-urls={peer}"),
                    format!("--initial-advertise-peer-urls={peer}"),
                    format!("--initial-cluster=default={peer}"),
                    "--unsafe-no-fsync=true".to_owned(),
                ])
            },
            |ports| async move {
                let port = ports.first().copied().unwrap_or_default();
                tokio::task::spawn_blocking(move || healthy(port))
                    .await
                    .map_err(|error| error.to_string())?
            },
        )
        .await?;
    let client_url = url(&launched.ports, 0);
    Ok(Etcd {
        launched,
        client_url,
    })
}

fn url(ports: &[u16], index: usize) -> String {
    format!(
        "http://127.0.0.1:{}",
        ports.get(index).copied().unwrap_or_default()
    )
}

/// `GET /health` over plain HTTP/1.0; etcd answers `{"health":"true",...}` once it serves.
fn healthy(port: u16) -> Result<(), String> {
    let exchange = || -> io::Result<String> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    match exchange() {
        Ok(response) if response.contains(r#""health":"true""#) => Ok(()),
        Ok(response) => Err(format!("GET /health answered {response:?}")),
        Err(error) => Err(format!("GET /health failed: {error}")),
    }
}
