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

/// `--store`: the stores to run the control plane on, in this order.
#[derive(clap::Args)]
pub struct Stores {
    /// Stores to run the control plane on, comma-separated.
    #[arg(
        long = "store",
        value_name = "STORE,STORE",
        value_delimiter = ',',
        default_value = "embedded,etcd"
    )]
    pub list: Vec<Backend>,
}
