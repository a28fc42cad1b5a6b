//! Keeps the node's failover events safe from its own sudden end (a SIGKILL, an OOM kill, a
//! supervisor's short stop): no event is lost silently (DESIGN §8).
//!
//! A task beside the config stream, every [`TICK`]:
//! - moves every event held in memory to the spool when no config stream is open, or when
//!   one of them has waited longer than [`BOUND`] for a control plane's ack (the spool then
//!   takes new events too, so that they leave in order);
//! - syncs the spool's file to the disk;
//! - saves the counts of lost events no control plane acked yet (`events-lost`).
//!
//! And every [`COUNT_TICK`] it records in the data dir how many events are in memory only
//! (`events-at-risk`), never sent and sent but not acked, which the next start counts as
//! `events.lost` (`node_killed`, `node_killed_unacked`) if this run never clears it: a
//! kill's loss is counted to within what a count tick sees come and go.
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
/// How often the count of events in memory only is recorded: one small write in place
/// when it changed (in a storm, each time), so that the count a kill leaves is at most this
/// old.
pub const COUNT_TICK: Duration = Duration::from_millis(20);

/// Runs until `stop` turns true (or its sender is gone).
pub async fn run(telemetry: Arc<Telemetry>, data_dir: PathBuf, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(COUNT_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let looks_every = (TICK.as_millis() / COUNT_TICK.as_millis()).max(1) as u64;
    let mut state = Saved::default();
    let mut at_risk = loss::AtRisk::new(&data_dir);
    for n in 0u64.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if n % looks_every == 0 {
            keep(&telemetry, &data_dir, &mut state).await;
        }
        let held = telemetry.events_at_risk();
        if at_risk.recorded() != Some(held) {
            let recorded = tokio::task::spawn_blocking(move || {
                let result = at_risk.record(held);
                (at_risk, result)
            })
            .await;
            match recorded {
                Ok((kept, result)) => {
                    at_risk = kept;
                    state.report(result);
                }
                // The record's file is dropped with the task: opened again next tick.
                Err(e) => {
                    at_risk = loss::AtRisk::new(&data_dir);
                    state.report(Err(std::io::Error::other(e.to_string())));
                }
            }
        }
    }
}

/// What the task last wrote to the data dir, so that it writes only changes.
#[derive(Default)]
struct Saved {
    losses: Option<u64>,
    /// The last error logged, so that a lasting one is logged once.
    failing: bool,
}

impl Saved {
    fn report(&mut self, result: std::io::Result<()>) {
        match result {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                warn!(error = %e, "cannot keep the failover events held in memory on disk, or their count; a kill now loses them uncounted");
            }
            Err(_) => {}
        }
    }
}

async fn keep(telemetry: &Telemetry, dir: &std::path::Path, saved: &mut Saved) {
    // Noted at every look, whatever the branch: the age of what is held is read from these.
    let overdue = telemetry.held_longer_than(BOUND);
    let mut result = Ok(());
    if telemetry.has_spool() && telemetry.events_held() > 0 && (overdue || !telemetry.connected()) {
        result = telemetry.spill_held().await.map(|_| ());
    }
    if result.is_ok() {
        result = telemetry.sync_spool().await;
    }
    let changes = telemetry.losses.changes();
    if saved.losses != Some(changes) {
        let (dir, reports) = (dir.to_owned(), telemetry.losses.unacked());
        let written = tokio::task::spawn_blocking(move || loss::save(&dir, &reports))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match written {
            Ok(()) => saved.losses = Some(changes),
            Err(e) => result = result.and(Err(e)),
        }
    }
    saved.report(result);
}
