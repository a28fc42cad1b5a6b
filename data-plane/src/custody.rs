//! Keeps the node's failover events safe from its own sudden end (a SIGKILL, an OOM kill, a
//! supervisor's short stop): no event is lost silently (docs/operating.md, "No event lost
//! silently").
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

/// What a failing count record would not keep, for its log line.
const COUNTED: &str = "the count of failover events held in memory only";

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
                    report(&mut state.count_failing, result, COUNTED);
                }
                // The record's file is dropped with the task: opened again next tick.
                Err(e) => {
                    at_risk = loss::AtRisk::new(&data_dir);
                    let e = std::io::Error::other(e.to_string());
                    report(&mut state.count_failing, Err(e), COUNTED);
                }
            }
        }
    }
}

/// What the task last wrote to the data dir, so that it writes only changes.
#[derive(Default)]
struct Saved {
    losses: Option<u64>,
    /// Whether the last look, and the last count, failed: a lasting error is logged once.
    look_failing: bool,
    count_failing: bool,
}

fn report(failing: &mut bool, result: std::io::Result<()>, what: &str) {
    match result {
        Ok(()) => *failing = false,
        Err(e) if !*failing => {
            *failing = true;
            warn!(error = %e, "cannot keep {what} on disk; a kill now loses them uncounted");
        }
        Err(_) => {}
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
    report(
        &mut saved.look_failing,
        result,
        "the failover events held in memory, or the counts of lost ones,",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{AtRiskCount, take_at_risk};
    use switchyard_proto::node::v1 as pb;

    fn event(id: &str) -> pb::FailoverEvent {
        pb::FailoverEvent { id: id.into(), ..Default::default() }
    }

    /// Polls `check` every 10 ms, for at most 10 s.
    async fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn held_events_are_counted_on_disk_and_go_to_the_spool_once_no_control_plane_is_connected()
     {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("event-spool");
        let t = Arc::new(crate::telemetry::spooled_for_tests(&spool));
        t.push_event(event("a"));
        t.push_event(event("b"));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(Arc::clone(&t), dir.path().to_owned(), stopped));
        let at_risk =
            |unsent, unacked| take_at_risk(dir.path()).unwrap() == AtRiskCount { unsent, unacked };
        // Connected, and young: held in memory, and counted.
        eventually("two events at risk recorded", || at_risk(2, 0)).await;
        assert_eq!(t.events_held(), 2);
        t.set_connected(false);
        eventually("the events spooled, none at risk", || t.events_held() == 0 && at_risk(0, 0))
            .await;
        let _ = stop.send(true);
        task.await.unwrap();
        drop(t);
        // On disk: what the next start finds.
        let next = crate::telemetry::spooled_for_tests(&spool);
        next.refill_from_spool().await;
        let ids: Vec<String> =
            next.next_event_batch().unwrap().events.into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["a", "b"]);
    }
}
