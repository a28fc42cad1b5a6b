//! Which store a benchmark runs its control plane on: `--store embedded,etcd`.

use crate::error::Result;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    Embedded,
    Etcd,
}

impl Backend {
    pub fn label(self) -> &'static str {
        match self {
            Backend::Embedded => "embedded (file://)",
            Backend::Etcd => "etcd",
        }
    }

    /// The value of `--store`: comma-separated `embedded` (or `file`) and `etcd`.
    pub fn parse_list(value: &str) -> Result<Vec<Backend>> {
        value
            .split(',')
            .map(|b| match b.trim() {
                "embedded" | "file" => Ok(Backend::Embedded),
                "etcd" => Ok(Backend::Etcd),
                other => Err(format!("--store: unknown backend {other:?}")),
            })
            .collect()
    }
}
