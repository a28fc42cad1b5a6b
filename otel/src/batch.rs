//! Batch export off the request path, through a bounded queue this crate owns.
//!
//! The SDK's own batch processors drop what does not fit in their queue and keep the count
//! to themselves; an operator needs to see it (docs/operating.md, "Traces and log records").
//! Here a request only ever `try_send`s into a bounded channel: a full queue (the collector
//! is slow or down and earlier batches wait) drops the record and counts it, and a batch the
//! collector does not take is counted too. One task per signal exports, so a request never
//! waits on the collector.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::logs::{LogBatch, LogExporter, LogProcessor, SdkLogRecord};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, mpsc};
use tokio::time::MissedTickBehavior;

use switchyard_backoff::Backoff;

use crate::context::Pause;
use crate::dropped::counter;
use crate::settings::Batching;

/// The longest `force_flush` waits for the export task.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// After a batch the collector did not take, the next one is tried 1 s later, then 2, 4, …
/// up to 30 s; batches in between are dropped unencoded. Encoding a batch for a collector
/// that refuses it costs the node as much CPU as exporting it, and a node whose collector
/// is down should pay for nothing it cannot deliver.
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// Where one signal's batches go.
pub trait Export<T>: Send + 'static {
    fn export(&mut self, batch: Vec<T>) -> impl Future<Output = Result<(), String>> + Send;
}

/// The request side of one signal's queue.
pub struct Queue<T> {
    tx: mpsc::Sender<T>,
    /// Wakes the export task once a whole batch waits. A push never wakes it otherwise:
    /// waking a task per span (two per request) cost a node more CPU than the spans, most
    /// of it in the kernel unparking an idle worker thread; the task drains the queue on
    /// its schedule instead.
    batch_ready: Arc<Notify>,
    max_batch: usize,
    flushes: mpsc::UnboundedSender<std::sync::mpsc::Sender<()>>,
    queue_full: Counter,
    pause: &'static Pause,
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue").field("capacity", &self.tx.max_capacity()).finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Queue<T> {
    /// Starts the export task on the current Tokio runtime.
    /// `pause` is set while the task waits out a refused batch, for the request path to make
    /// no records meanwhile.
    pub fn start<E: Export<T>>(
        signal: &'static str,
        batching: Batching,
        exporter: E,
        pause: &'static Pause,
    ) -> Self {
        let (tx, rx) = mpsc::channel(batching.max_queue);
        let (flushes, flush_rx) = mpsc::unbounded_channel();
        let out = Exporting {
            signal,
            exporter,
            export_failed: counter(signal, "export_failed"),
            collector_down: counter(signal, "collector_down"),
            failures: 0,
            retry_at: None,
            pause,
        };
        let batch_ready = Arc::new(Notify::new());
        let max_batch = batching.max_batch;
        tokio::spawn(run(batching, out, rx, Arc::clone(&batch_ready), flush_rx));
        Self {
            tx,
            batch_ready,
            max_batch,
            flushes,
            queue_full: counter(signal, "queue_full"),
            pause,
        }
    }

    /// Never waits: with the queue full, or the collector down, the record is dropped and
    /// counted.
    pub fn push(&self, item: T) {
        if self.pause.is_paused() {
            self.pause.count();
            return;
        }
        if self.tx.try_send(item).is_err() {
            self.queue_full.inc();
            return;
        }
        if self.tx.max_capacity() - self.tx.capacity() >= self.max_batch {
            self.batch_ready.notify_one();
        }
    }

    /// Exports what is queued now and waits for it, at most `timeout`. Blocks the calling
    /// thread (the SDK's flush and shutdown are synchronous), never the export task's.
    pub fn flush(&self, timeout: Duration) -> OTelSdkResult {
        let (done, wait) = std::sync::mpsc::channel();
        self.flushes.send(done).map_err(|_| OTelSdkError::AlreadyShutdown)?;
        wait.recv_timeout(timeout).map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

struct Exporting<E> {
    signal: &'static str,
    exporter: E,
    export_failed: Counter,
    /// Batches dropped without an export while the collector is given time to come back.
    collector_down: Counter,
    /// Batches failed in a row: a collector that is down is logged once, not per batch.
    failures: u32,
    /// Until when batches are dropped instead of exported.
    retry_at: Option<tokio::time::Instant>,
    /// Set with `retry_at`, cleared once it has passed.
    pause: &'static Pause,
}

impl<E> Exporting<E> {
    async fn send<T>(&mut self, batch: &mut Vec<T>)
    where
        E: Export<T>,
    {
        if batch.is_empty() {
            return;
        }
        if self.retry_at.is_some_and(|at| tokio::time::Instant::now() < at) {
            self.collector_down.inc_by(batch.len() as u64);
            batch.clear();
            return;
        }
        let items = std::mem::replace(batch, Vec::with_capacity(batch.capacity()));
        let n = items.len() as u64;
        match self.exporter.export(items).await {
            Ok(()) => {
                if self.failures > 0 {
                    tracing::info!(signal = self.signal, "OpenTelemetry export works again");
                }
                self.failures = 0;
                self.retry_at = None;
                self.pause.set(false);
            }
            Err(why) => {
                if self.failures == 0 {
                    tracing::warn!(
                        signal = self.signal, error = %why,
                        "OpenTelemetry export failed; batches are dropped (and counted) until the collector takes them"
                    );
                }
                // Paused before the drop is counted: whoever sees the count sees the pause.
                self.retry_at = Some(tokio::time::Instant::now() + RETRY.ceiling(self.failures));
                self.failures = self.failures.saturating_add(1);
                self.pause.set(true);
                self.export_failed.inc_by(n);
            }
        }
    }
}

async fn run<T, E: Export<T>>(
    batching: Batching,
    mut out: Exporting<E>,
    mut rx: mpsc::Receiver<T>,
    batch_ready: Arc<Notify>,
    mut flushes: mpsc::UnboundedReceiver<std::sync::mpsc::Sender<()>>,
) {
    let mut batch = Vec::with_capacity(batching.max_batch);
    let mut tick = tokio::time::interval(batching.delay);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        // Woken by the schedule, a whole batch waiting, or a flush; never per record.
        let done = tokio::select! {
            _ = tick.tick() => None,
            () = batch_ready.notified() => None,
            Some(done) = flushes.recv() => Some(done),
        };
        // The retry is due: records are made again, and the next batch tries the collector.
        if out.retry_at.is_some_and(|at| tokio::time::Instant::now() >= at) {
            out.pause.set(false);
        }
        let open = drain(&mut rx, &mut batch, batching.max_batch, &mut out).await;
        out.send(&mut batch).await;
        if let Some(done) = done {
            let _ = done.send(());
        }
        if !open {
            return;
        }
    }
}

/// Exports everything queued, in batches of at most `max_batch` (the last one is left in
/// `batch`); `false` once every sender is gone.
async fn drain<T, E: Export<T>>(
    rx: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    max_batch: usize,
    out: &mut Exporting<E>,
) -> bool {
    loop {
        match rx.try_recv() {
            Ok(item) => {
                batch.push(item);
                if batch.len() >= max_batch {
                    out.send(batch).await;
                }
            }
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
}

// === spans ===

pub struct Spans(pub opentelemetry_otlp::SpanExporter);

impl Export<SpanData> for Spans {
    async fn export(&mut self, batch: Vec<SpanData>) -> Result<(), String> {
        self.0.export(batch).await.map_err(|e| e.to_string())
    }
}

#[derive(Debug)]
pub struct SpanQueue(pub Queue<SpanData>);

impl SpanProcessor for SpanQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() {
            self.0.push(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.flush(FLUSH_TIMEOUT)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.flush(timeout)
    }
}

// === log records ===

pub struct Logs(pub opentelemetry_otlp::LogExporter);

type LogItem = (SdkLogRecord, InstrumentationScope);

impl Export<LogItem> for Logs {
    async fn export(&mut self, batch: Vec<LogItem>) -> Result<(), String> {
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            batch.iter().map(|(record, scope)| (record, scope)).collect();
        self.0.export(LogBatch::new(&refs)).await.map_err(|e| e.to_string())
    }
}

#[derive(Debug)]
pub struct LogQueue(pub Queue<LogItem>);

impl LogProcessor for LogQueue {
    fn emit(&self, record: &mut SdkLogRecord, scope: &InstrumentationScope) {
        self.0.push((record.clone(), scope.clone()));
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.flush(FLUSH_TIMEOUT)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.flush(timeout)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Takes batches into `seen` after waiting for `gate`, or refuses them.
    struct Collector {
        seen: Arc<Mutex<Vec<Vec<u32>>>>,
        gate: Arc<tokio::sync::Semaphore>,
        up: bool,
    }

    impl Export<u32> for Collector {
        async fn export(&mut self, batch: Vec<u32>) -> Result<(), String> {
            let _permit = self.gate.acquire().await.map_err(|e| e.to_string())?;
            if !self.up {
                return Err("connection refused".into());
            }
            self.seen.lock().unwrap().push(batch);
            Ok(())
        }
    }

    fn pause(signal: &'static str) -> &'static Pause {
        Box::leak(Box::new(Pause::new(signal)))
    }

    fn batching(max_queue: usize, max_batch: usize) -> Batching {
        Batching { delay: Duration::from_secs(3600), max_queue, max_batch }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_drops_without_waiting_and_counts_what_it_dropped() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        // The collector holds the first batch until the gate opens: the queue fills behind it.
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let collector = Collector { seen: Arc::clone(&seen), gate: Arc::clone(&gate), up: true };
        let queue = Queue::start("test_full", batching(4, 2), collector, pause("test_full"));
        let before = counter("test_full", "queue_full").get();
        queue.push(1);
        queue.push(2);
        // Wait until the export task has taken the first batch out of the queue.
        while queue.tx.capacity() < 4 {
            tokio::task::yield_now().await;
        }
        for n in 3..=10 {
            queue.push(n);
        }
        let dropped = counter("test_full", "queue_full").get() - before;
        assert_eq!(dropped, 4, "8 pushed behind a stuck batch into a queue of 4");
        gate.add_permits(100);
        let flushed = tokio::task::spawn_blocking(move || queue.flush(Duration::from_secs(5)));
        flushed.await.unwrap().unwrap();
        let exported: usize = seen.lock().unwrap().iter().map(Vec::len).sum();
        assert_eq!(exported as u64 + dropped, 10, "every record exported or counted");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_the_collector_refuses_is_counted() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(100));
        let collector = Collector { seen, gate, up: false };
        let queue =
            Queue::start("test_refused", batching(16, 16), collector, pause("test_refused"));
        let before = counter("test_refused", "export_failed").get();
        for n in 0..3 {
            queue.push(n);
        }
        let flushed = tokio::task::spawn_blocking(move || queue.flush(Duration::from_secs(5)));
        flushed.await.unwrap().unwrap();
        assert_eq!(counter("test_refused", "export_failed").get() - before, 3);
    }

    /// Counts its calls and refuses every batch.
    struct Refusing(Arc<std::sync::atomic::AtomicUsize>);

    impl Export<u32> for Refusing {
        async fn export(&mut self, _batch: Vec<u32>) -> Result<(), String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err("connection refused".into())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_refused_batch_the_next_ones_are_dropped_unsent_until_the_retry() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let queue = Arc::new(Queue::start(
            "test_down",
            batching(16, 16),
            Refusing(Arc::clone(&calls)),
            pause("test_down"),
        ));
        let flush = |queue: &Arc<Queue<u32>>| {
            let queue = Arc::clone(queue);
            tokio::task::spawn_blocking(move || queue.flush(Duration::from_secs(5)))
        };
        let down_before = counter("test_down", "collector_down").get();
        queue.push(1);
        flush(&queue).await.unwrap().unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Within the first retry's second: dropped, counted, and the collector not called.
        for n in 2..=4 {
            queue.push(n);
        }
        flush(&queue).await.unwrap().unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "no export while waiting");
        assert_eq!(counter("test_down", "collector_down").get() - down_before, 3);
        assert_eq!(counter("test_down", "export_failed").get(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_batch_pauses_the_signal_until_the_retry_is_due() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let pause = pause("test_pause");
        let queue = Arc::new(Queue::start(
            "test_pause",
            batching(16, 16),
            Refusing(Arc::clone(&calls)),
            pause,
        ));
        let flush = |queue: &Arc<Queue<u32>>| {
            let queue = Arc::clone(queue);
            tokio::task::spawn_blocking(move || queue.flush(Duration::from_secs(5)))
        };
        assert!(!pause.is_paused());
        queue.push(1);
        let refused_at = tokio::time::Instant::now();
        flush(&queue).await.unwrap().unwrap();
        assert!(pause.is_paused(), "the request path makes no records while the collector is down");
        // What is made anyway (a span already started) is counted, not queued.
        let down_before = counter("test_pause", "collector_down").get();
        queue.push(2);
        assert_eq!(counter("test_pause", "collector_down").get() - down_before, 1);
        // The first retry is 1 s after the refusal: then records are made again (at the
        // export task's next wake: a flush here), and the next batch tries the collector.
        loop {
            flush(&queue).await.unwrap().unwrap();
            if !pause.is_paused() {
                break;
            }
            assert!(refused_at.elapsed() < Duration::from_secs(5), "still paused after 5 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(refused_at.elapsed() >= Duration::from_secs(1), "paused until the retry is due");
        queue.push(3);
        flush(&queue).await.unwrap().unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2, "tried again");
        assert!(pause.is_paused(), "refused again");
    }
}
