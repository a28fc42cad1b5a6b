//! Keeps the node's failover events safe from its own sudden end (a SIGKILL, an OOM kill, a
//! supervisor's short stop): no event is lost silently (DESIGN §8).
//!
//! A task beside the config stream, every [`TICK`]:
//! - moves every event held in memory to the spool when no config stream is open, or when
//!   one of them has waited longer than [`BOUND`] for a control plane's ack (the spool then
//!   takes new events too, so that they leave in order);
//! - syncs the spool's file to the disk;
//! - records in the data dir how many events are still in memory only (`events-at-risk`),
//!   which the next start counts as `events.lost` (`node_killed`) if this run never clears
//!   it; and the counts of lost events no control plane acked yet (`events-lost`).
//!
//! The request path is untouched: it pushes into memory (or hands to the spool's thread) as
//! before; all the disk work is here and on the spool's thread.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::warn;

use crate::loss;
use crate::telemetry::Telemetry;

/// An event no control plane acked within this long is moved to the spool on disk. Acks
/// normally come within a few hundred milliseconds (events go out every 100 ms and the
/// control plane stores a batch per write round); a second leaves a slow control plane
/// room before its events are sent again from the spool.
pub const BOUND: Duration = Duration::from_secs(1);
/// How often the task looks. With no control plane connected, events move to the spool
/// within one tick.
pub const TICK: Duration = Duration::from_millis(250);

/// Runs until `stop` turns true (or its sender is gone).
pub async fn run(telemetry: Arc<Telemetry>, data_dir: PathBuf, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = Saved::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        keep(&telemetry, &data_dir, &mut state).await;
    }
}

/// What the task last wrote to the data dir, so that it writes only changes.
#[derive(Default)]
struct Saved {
    at_risk: Option<u64>,
    losses: Option<u64>,
    /// The last error logged, so that a lasting one is logged once.
    failing: bool,
}

async fn keep(telemetry: &Telemetry, dir: &std::path::Path, saved: &mut Saved) {
    // Noted at every tick, whatever the branch: the age of what is held is read from these.
    let overdue = telemetry.held_longer_than(BOUND);
    let mut result = Ok(());
    if telemetry.has_spool() && telemetry.events_held() > 0 && (overdue || !telemetry.connected()) {
        result = telemetry.spill_held().await.map(|_| ());
    }
    if result.is_ok() {
        result = telemetry.sync_spool().await;
    }
    let at_risk = telemetry.events_held() as u64;
    let changes = telemetry.losses.changes();
    let (dir, write_risk, write_losses) =
        (dir.to_owned(), saved.at_risk != Some(at_risk), saved.losses != Some(changes));
    let reports = write_losses.then(|| telemetry.losses.unacked());
    let written = tokio::task::spawn_blocking(move || {
        if let Some(reports) = reports {
            loss::save(&dir, &reports)?;
        }
        if write_risk {
            loss::save_at_risk(&dir, at_risk)?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    match written {
        Ok(()) => {
            saved.at_risk = Some(at_risk);
            saved.losses = Some(changes);
        }
        Err(e) => result = result.and(Err(e)),
    }
    match result {
        Ok(()) => saved.failing = false,
        Err(e) if !saved.failing => {
            saved.failing = true;
            warn!(error = %e, "cannot keep the failover events held in memory on disk; a kill now loses them uncounted");
        }
        Err(_) => {}
    }
}
