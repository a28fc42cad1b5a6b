//! Exponential backoff with full jitter, the one formula every retry loop in Switchyard
//! uses: a node reconnecting to the control plane, the control plane's fan-out watch,
//! webhook delivery and retries of an upstream call.
//!
//! Full jitter (sleep a uniform random time in `[0, min(max, base × 2^n)]`) spreads clients
//! that failed together, so they do not come back together; it is the variant AWS's
//! architecture blog measured as doing the least total work under contention
//! ("Exponential Backoff And Jitter", 2015).
#![forbid(unsafe_code)]

use std::time::Duration;

/// The bounds of a backoff: the first ceiling and the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The largest wait before retry number `attempt` (0 for the first retry):
    /// `min(max, base × 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The wait before retry number `attempt`: uniform in `[0, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        ceiling.mul_f64(rand::random::<f64>())
    }

    /// Retries as an iterator of waits, for loops that count their own attempts.
    pub fn iter(self) -> impl Iterator<Item = Duration> {
        (0u32..).map(move |n| self.delay(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(4), Duration::from_millis(1_600));
        assert_eq!(b.ceiling(5), Duration::from_secs(2));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn delays_stay_within_the_ceiling_and_spread() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let delays: Vec<_> = (0..200).map(|_| b.delay(3)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(800)));
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "full jitter spreads the waits");
    }
}
