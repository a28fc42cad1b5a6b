//! Flag values shared by the subcommands' command lines (clap value parsers). A bad value is
//! refused by clap with the flag's name and a non-zero exit.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;

use crate::error::Result;
use crate::proc::default_switchyard;

/// An integer flag value in `lo..=hi`.
pub fn bounded<T>(lo: u64, hi: u64) -> RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    RangedU64ValueParser::new().range(lo..=hi)
}

/// Seconds in (0, 600], fractions allowed (`--warmup-secs 0.5`).
pub fn secs(v: &str) -> std::result::Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= 600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("expected seconds in (0, 600], got {v:?}"))
}

/// `--concurrency` of the A/B comparisons and `chaos`.
#[derive(clap::Args)]
pub struct Concurrency {
    /// Concurrencies to measure, comma-separated (each 1–1024).
    #[arg(long = "concurrency", value_name = "N,N", value_delimiter = ',', default_value = "1,8",
        value_parser = bounded::<usize>(1, 1024))]
    pub list: Vec<usize>,
}

/// `--switchyard PATH`: the binary every subcommand starts its processes from.
#[derive(clap::Args)]
pub struct Switchyard {
    /// The `switchyard` binary (default: the one next to this binary).
    #[arg(long = "switchyard", value_name = "PATH")]
    path: Option<PathBuf>,
}

impl Switchyard {
    /// The path given, or the `switchyard` binary next to the bench's own.
    pub fn path(self) -> Result<PathBuf> {
        match self.path {
            Some(path) => Ok(path),
            None => default_switchyard(),
        }
    }

    /// [`Switchyard::path`], refused unless a file is there.
    pub fn existing(self) -> Result<PathBuf> {
        let path = self.path()?;
        if !path.is_file() {
            // `cargo run --release -p switchyard-bench` puts us in target/release, next to
            // the `switchyard` binary that `cargo build --release -p switchyard-cli` made.
            return Err(format!(
                "{} not found: build it with `cargo build -p switchyard-cli` (`--release` for a \
                 release bench) or pass --switchyard PATH",
                path.display()
            ));
        }
        Ok(path)
    }
}
