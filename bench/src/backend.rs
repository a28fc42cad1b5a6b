//! Which store a benchmark runs its control plane on: `--store embedded,etcd` (`file` is
//! `embedded`).

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Backend {
    #[value(alias = "file")]
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
}
