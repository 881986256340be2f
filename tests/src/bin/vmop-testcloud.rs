//! Runs a testcloud (`vmop_tests::cloud`: an in-memory cloud with an HTTP JSON API) until
//! killed. Prints its endpoint as the first line of stdout once it accepts connections.
//!
//! ```text
//! cargo run -p vmop-tests --bin vmop-testcloud -- --listen 127.0.0.1:0 --token t0ken > /tmp/tc &
//! endpoint=$(head -1 /tmp/tc)
//! curl -H 'authorization: Bearer t0ken' "$endpoint/v1/machines"
//! ```

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use vmop_tests::cloud::{self, Config};

#[derive(Debug, Parser)]
#[command(about = "Serve an in-memory test cloud (HTTP JSON API) until killed")]
struct Args {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Bearer token every request must carry (401 otherwise).
    #[arg(long, env = "VMOP_TESTCLOUD_TOKEN")]
    token: Option<String>,
    /// An image `create` accepts besides the default one (repeatable).
    #[arg(long = "image", value_name = "IMAGE")]
    images: Vec<String>,
    /// Delay before every answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Requests per second beyond which the cloud answers 429 with Retry-After.
    #[arg(long)]
    rate: Option<f64>,
    /// Requests allowed at once under `--rate`.
    #[arg(long, default_value_t = 10)]
    burst: u32,
}

impl Args {
    fn config(&self) -> Config {
        let mut config = Config::default().with_latency(Duration::from_millis(self.latency_ms));
        config.token = self.token.clone();
        config.images.extend(self.images.iter().cloned());
        if let Some(rate) = self.rate {
            config = config.with_rate_limit(rate, self.burst);
        }
        config
    }
}

// One thread is enough: the cloud only parses and answers small requests, and it shares the
// benchmark machine's cores with the control plane and the operator under test.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("failed to listen on {}", args.listen))?;
    let endpoint = cloud::endpoint(&listener)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{endpoint}").context("failed to print the endpoint")?;
    stdout.flush().context("failed to print the endpoint")?;
    drop(stdout);
    cloud::serve(listener, args.config())
        .await
        .context("the server failed")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn arguments_are_consistent() {
        super::Args::command().debug_assert();
    }
}
