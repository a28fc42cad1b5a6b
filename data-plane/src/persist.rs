//! Last-known-good config on the node's disk, so that a node restarted while no control
//! plane answers still serves.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{debug, warn};

use crate::config::{NodeConfig, Persisted};

const FILE: &str = "config.json";

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE)
}

/// Reads the persisted config, if any. A missing file is not an error; an unreadable one is
/// reported and ignored (the node then waits for a control plane, as a new node would).
pub async fn load(data_dir: &Path) -> Option<NodeConfig> {
    let file = path(data_dir);
    let bytes = match tokio::fs::read(&file).await {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn!(file = %file.display(), error = %e, "cannot read last-known-good config");
            return None;
        }
    };
    // Applying resolves provider credentials (file reads): off the async threads.
    let applied = tokio::task::spawn_blocking(move || {
        serde_json::from_slice::<Persisted>(&bytes)
            .map_err(|e| e.to_string())
            .map(Persisted::into_change)
            .and_then(|change| NodeConfig::default().apply(change).map_err(|e| e.to_string()))
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match applied {
        Ok(config) => Some(config),
        Err(e) => {
            warn!(file = %file.display(), error = %e, "ignoring unusable last-known-good config");
            None
        }
    }
}

/// Writes each new config to disk, coalescing bursts: only the newest version is written.
pub async fn run(data_dir: PathBuf, mut configs: watch::Receiver<Option<Arc<NodeConfig>>>) {
    while configs.changed().await.is_ok() {
        let Some(config) = configs.borrow_and_update().clone() else { continue };
        let dir = data_dir.clone();
        let version = config.version;
        match tokio::task::spawn_blocking(move || write(&dir, &config)).await {
            Ok(Ok(())) => debug!(version, "persisted config"),
            Ok(Err(e)) => warn!(version, error = %e, "cannot persist config"),
            Err(e) => warn!(version, error = %e, "config persister failed"),
        }
    }
}

/// Write to a temporary file, fsync, rename over the old one: a crash leaves either the old
/// or the new config, never half of one.
fn write(dir: &Path, config: &NodeConfig) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
    config.write_persisted(&mut file).map_err(std::io::Error::other)?;
    file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, path(dir))?;
    std::fs::File::open(dir)?.sync_all()
}
