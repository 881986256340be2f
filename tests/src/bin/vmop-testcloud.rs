//! Runs a testcloud (`vmop_tests::cloud`: an in-memory cloud with an HTTP JSON API) until
//! killed. Prints its endpoint as the first line of stdout once it accepts connections.
//!
//! ```text
//! cargo run -p vmop-tests --bin vmop-testcloud -- --listen 127.0.0.1:0 --token t0ken > /tmp/tc &
//! endpoint=$(head -1 /tmp/tc)
//! curl -H 'authorization: Bearer t0ken' "$endpoint/v1/machines"
//! ```
//!
//! EC2-like (the scale benchmark's `--cloud ec2-like`): EC2's request and resource token
//! buckets, scaled by one factor, and a delay drawn from a range for every answer:
//!
//! ```text
//! vmop-testcloud --ec2-buckets --ec2-scale 0.5 --latency 50ms..200ms
//! ```

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use vmop_tests::cloud::{self, Config, Ec2Limits};

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
    #[arg(long, default_value_t = 0, conflicts_with = "latency")]
    latency_ms: u64,
    /// Delay before every answer: a duration (`150ms`, `1.5s`, `800us`) or a range `MIN..MAX`
    /// (`50ms..200ms`), each answer's delay drawn uniformly from it.
    #[arg(long, value_name = "DURATION[..DURATION]", value_parser = parse_latency)]
    latency: Option<(Duration, Duration)>,
    /// Requests per second beyond which the cloud answers 429 with Retry-After.
    #[arg(long)]
    rate: Option<f64>,
    /// Requests allowed at once under `--rate`.
    #[arg(long, default_value_t = 10)]
    burst: u32,
    /// EC2-like throttling (429 with Retry-After): GETs from a bucket of 100 refilled at 20/s,
    /// other methods from one of 200 at 5/s; creates also from a RunInstances bucket of 1000 at
    /// 2/s, deletes from a TerminateInstances bucket of 1000 at 20/s (times `--ec2-scale`).
    #[arg(long)]
    ec2_buckets: bool,
    /// Every `--ec2-buckets` bucket's size and refill rate times this factor (sizes rounded,
    /// at least 1).
    #[arg(long, default_value_t = 1.0, requires = "ec2_buckets", value_parser = parse_factor)]
    ec2_scale: f64,
}

impl Args {
    fn config(&self) -> Config {
        let (min, max) = self.latency.unwrap_or_else(|| {
            let fixed = Duration::from_millis(self.latency_ms);
            (fixed, fixed)
        });
        let mut config = Config::default().with_latency_range(min, max);
        config.token = self.token.clone();
        config.images.extend(self.images.iter().cloned());
        if let Some(rate) = self.rate {
            config = config.with_rate_limit(rate, self.burst);
        }
        if self.ec2_buckets {
            config = config.with_ec2(Ec2Limits::EC2.scaled(self.ec2_scale));
        }
        config
    }
}

/// `D` or `MIN..MAX` (see [`parse_duration`]); `MAX` not below `MIN`.
fn parse_latency(text: &str) -> Result<(Duration, Duration), String> {
    let (min, max) = match text.split_once("..") {
        Some((min, max)) => (parse_duration(min)?, parse_duration(max)?),
        None => {
            let fixed = parse_duration(text)?;
            (fixed, fixed)
        }
    };
    if max < min {
        return Err(format!("the range {text} ends before it starts"));
    }
    Ok((min, max))
}

/// A non-negative decimal number with a unit: `us`, `ms` or `s` (`50ms`, `1.5s`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number with a unit (50ms, 1.5s)"))?;
    let seconds = match unit {
        "us" => number / 1e6,
        "ms" => number / 1e3,
        "s" => number,
        _ => return Err(format!("{text:?}: the unit is us, ms or s")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|err| format!("{text:?}: {err}"))
}

/// A finite factor greater than 0.
fn parse_factor(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(factor) if factor.is_finite() && factor > 0.0 => Ok(factor),
        _ => Err(format!("{text:?} is not a number greater than 0")),
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
    use std::time::Duration;

    use clap::{CommandFactory as _, Parser as _};

    use super::{Args, parse_latency};

    #[test]
    fn arguments_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn latencies_are_durations_or_ranges() {
        let ms = Duration::from_millis;
        assert_eq!(parse_latency("50ms..200ms"), Ok((ms(50), ms(200))));
        assert_eq!(parse_latency("1.5s"), Ok((ms(1500), ms(1500))));
        assert_eq!(
            parse_latency("800us..1ms"),
            Ok((ms(0) + Duration::from_micros(800), ms(1)))
        );
        for bad in ["50", "ms", "200ms..50ms", "5m", "-1ms", "1ms..", ""] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_ec2_mode_scales_every_bucket() {
        let args = Args::parse_from([
            "t",
            "--ec2-buckets",
            "--ec2-scale",
            "0.5",
            "--latency",
            "50ms..200ms",
        ]);
        let config = args.config();
        let ec2 = config.ec2.unwrap_or_default();
        assert_eq!((ec2.read.burst, ec2.read.per_second), (50, 10.0));
        assert_eq!((ec2.mutate.burst, ec2.mutate.per_second), (100, 2.5));
        assert_eq!((ec2.run.burst, ec2.run.per_second), (500, 1.0));
        assert_eq!((ec2.terminate.burst, ec2.terminate.per_second), (500, 10.0));
        assert_eq!(
            (config.latency, config.latency_max),
            (Duration::from_millis(50), Duration::from_millis(200))
        );
        assert!(
            Args::try_parse_from(["t", "--ec2-scale", "2"]).is_err(),
            "needs --ec2-buckets"
        );
        assert!(Args::try_parse_from(["t", "--ec2-buckets", "--ec2-scale", "0"]).is_err());
        assert!(Args::try_parse_from(["t", "--latency", "1ms", "--latency-ms", "3"]).is_err());
        let plain = Args::parse_from(["t", "--latency-ms", "3"]).config();
        assert_eq!(
            (plain.latency, plain.latency_max, plain.ec2),
            (Duration::from_millis(3), Duration::from_millis(3), None)
        );
    }
}
