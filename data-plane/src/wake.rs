//! [`Repoll`]: a future that answers its own wake-ups at once.
//!
//! A client connection's task wakes itself once per request: hyper's HTTP/1 dispatcher
//! hands the request body to the handler through a channel whose receiver, on taking the
//! bytes, wakes the sender's task (hyper 1.12, `body/chan.rs`, `Receiver::poll_next`), and
//! the handler is polled inside that very task. Tokio treats a wake-up that arrives while
//! the task runs as a yield: the task goes to the back of the run queue and a parked worker
//! is unparked to steal it. At one connection that worker finds nothing, parks again, and
//! the node pays a futex wake and two context switches per request for no work
//! (docs/BENCHMARKS.md, "Where a node's CPU goes").
//!
//! [`Repoll`] gives the inner future a waker of its own. A wake-up that arrives while the
//! inner future is being polled only sets a flag, and the inner future is polled again
//! before `poll` returns; a wake-up at any other time goes straight to the task. A future
//! that keeps waking itself is polled again at most `MAX_POLLS` times, or until tokio's
//! cooperative budget is spent, and then yields to the runtime (a yield it asks for, such as
//! hyper's after many loop turns, is answered the same way, within that bound).
//! Nothing here depends on how hyper works inside: without the self-wake it costs one
//! atomic store and one compare-exchange per poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls of the inner future per call of [`Repoll::poll`] at most.
const MAX_POLLS: usize = 8;

/// No poll in progress: a wake-up goes to the task.
const IDLE: u8 = 0;
/// The inner future is being polled and nothing has woken it yet.
const POLLING: u8 = 1;
/// The inner future woke itself (or was woken) during the current poll.
const WOKEN: u8 = 2;

pub struct Repoll<F> {
    inner: Pin<Box<F>>,
    shared: Arc<Shared>,
    waker: Waker,
}

struct Shared {
    state: AtomicU8,
    task: AtomicWaker,
}

impl<F: Future> Repoll<F> {
    pub fn new(inner: F) -> Self {
        let shared = Arc::new(Shared { state: AtomicU8::new(IDLE), task: AtomicWaker::new() });
        let waker = Waker::from(Arc::clone(&shared));
        Self { inner: Box::pin(inner), shared, waker }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Registered before polling, so a wake-up from another thread after the state
        // returns to IDLE finds the current task.
        this.shared.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_POLLS {
            this.shared.state.store(POLLING, Ordering::SeqCst);
            if let Poll::Ready(output) = this.inner.as_mut().poll(&mut inner_cx) {
                this.shared.state.store(IDLE, Ordering::SeqCst);
                return Poll::Ready(output);
            }
            if this
                .shared
                .state
                .compare_exchange(POLLING, IDLE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Poll::Pending;
            }
            // Woken during the poll. Poll again now, unless tokio asked the task to yield.
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
        }
        // Out of polls or budget: hand the wake-up to the runtime, as an ordinary yield.
        this.shared.state.store(IDLE, Ordering::SeqCst);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Ordering::SeqCst);
        loop {
            match state {
                POLLING => match self.state.compare_exchange(
                    POLLING,
                    WOKEN,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => return,
                    Err(now) => state = now,
                },
                WOKEN => return,
                _ => {
                    self.task.wake();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A task waker that counts its wake-ups.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Counter {
        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Wakes itself on each of its first `self_wakes` polls, then completes.
    struct WakesItself {
        self_wakes: usize,
        polls: usize,
    }

    impl Future for WakesItself {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.self_wakes {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_up_during_the_poll_is_answered_by_polling_again_not_by_the_task() {
        let counter = Arc::new(Counter::default());
        let task = Waker::from(Arc::clone(&counter));
        let mut future = Repoll::new(WakesItself { self_wakes: 2, polls: 0 });
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&task));
        assert_eq!(polled, Poll::Ready(3), "completed within one poll of the task");
        assert_eq!(counter.count(), 0, "the task was never woken");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields_to_the_runtime() {
        let counter = Arc::new(Counter::default());
        let task = Waker::from(Arc::clone(&counter));
        let mut future = Repoll::new(WakesItself { self_wakes: usize::MAX, polls: 0 });
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&task));
        assert_eq!(polled, Poll::Pending);
        assert_eq!(counter.count(), 1, "the task is woken to be polled again later");
        assert_eq!(future.inner.polls, MAX_POLLS);
    }

    #[test]
    fn a_wake_up_between_polls_reaches_the_task() {
        let counter = Arc::new(Counter::default());
        let task = Waker::from(Arc::clone(&counter));
        // Pending forever, keeping the waker it was given.
        let (tx, rx) = std::sync::mpsc::channel::<Waker>();
        let inner = futures_util::future::poll_fn(move |cx: &mut Context<'_>| {
            tx.send(cx.waker().clone()).unwrap();
            Poll::<()>::Pending
        });
        let mut future = Repoll::new(inner);
        assert!(Pin::new(&mut future).poll(&mut Context::from_waker(&task)).is_pending());
        let inner_waker = rx.recv().unwrap();
        std::thread::spawn(move || inner_waker.wake()).join().unwrap();
        assert_eq!(counter.count(), 1, "a wake-up from another thread is not lost");
    }

    #[tokio::test]
    async fn a_spent_budget_ends_the_extra_polls() {
        let mut future = Repoll::new(WakesItself { self_wakes: 3, polls: 0 });
        let counter = Arc::new(Counter::default());
        let task = Waker::from(Arc::clone(&counter));
        // Spend the task's budget, as a busy connection would.
        while tokio::task::coop::has_budget_remaining() {
            tokio::task::coop::consume_budget().await;
        }
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&task));
        assert_eq!(polled, Poll::Pending);
        assert_eq!(future.inner.polls, 1, "no extra poll without budget");
        assert_eq!(counter.count(), 1);
    }
}
