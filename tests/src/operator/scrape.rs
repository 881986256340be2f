//! The operator's `/metrics`, fetched over loopback and read minimally: a sample is a line
//! `name{labels} value` or `name value` of the Prometheus text format, which is all that
//! counters, gauges and histogram `_count`s need.

use std::net::SocketAddr;

use anyhow::{Context as _, ensure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::DEADLINE;

/// One scrape of `/metrics`.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub text: String,
}

impl Scrape {
    /// The sum of the samples of `name` whose labels include every `key="value"` of `labels`;
    /// 0 when there is none (a labelled series appears on its first increment).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .filter(|(series, _)| {
                let (series_name, label_text) = match series.split_once('{') {
                    Some((n, rest)) => (n, format!(",{rest}")),
                    None => (*series, String::new()),
                };
                series_name == name
                    && labels
                        .iter()
                        .all(|(k, v)| label_text.contains(&format!(",{k}=\"{v}\"")))
            })
            .filter_map(|(_, value)| value.parse::<f64>().ok())
            .sum()
    }
}

/// `GET /metrics` from `addr` (HTTP/1.1, one request per connection).
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<Scrape> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(DEADLINE, exchange)
        .await
        .with_context(|| format!("{addr}/metrics did not answer in time"))??;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("no end of headers from {addr}/metrics: {raw:?}"))?;
    let status = head.lines().next().unwrap_or_default();
    ensure!(
        status.split(' ').nth(1) == Some("200"),
        "{addr}/metrics answered {status:?}"
    );
    Ok(Scrape {
        text: body.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_samples_with_the_given_labels() {
        let scrape = Scrape {
            text: [
                "# TYPE vmop_provider_calls counter",
                r#"vmop_provider_calls_total{provider_config="aws",operation="get",outcome="ok"} 3"#,
                r#"vmop_provider_calls_total{provider_config="aws",operation="get",outcome="transient"} 1"#,
                r#"vmop_provider_calls_total{provider_config="aws",operation="create",outcome="ok"} 1"#,
                r#"vmop_provider_calls_total_x{provider_config="aws",operation="get",outcome="ok"} 9"#,
                "up 1",
            ]
            .join("\n"),
        };
        let get = scrape.sum("vmop_provider_calls_total", &[("operation", "get")]);
        assert_eq!(get, 4.0);
        let create_ok = [("operation", "create"), ("outcome", "ok")];
        assert_eq!(scrape.sum("vmop_provider_calls_total", &create_ok), 1.0);
        assert_eq!(
            scrape.sum("vmop_provider_calls_total", &[("config", "aws")]),
            0.0
        );
        assert_eq!(scrape.sum("up", &[]), 1.0);
        assert_eq!(scrape.sum("down", &[]), 0.0);
    }
}
