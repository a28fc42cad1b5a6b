//! Switchyard's one clock, one duration parser and one `Retry-After` reader. Every crate
//! takes wall-clock time and human durations from here, so a timestamp means the same in
//! the audit log, a webhook payload and the CLI.
#![forbid(unsafe_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the unix epoch, now. Wall-clock time, for timestamps that leave the
/// process (events, audit entries, heartbeats); use `Instant` to measure intervals.
pub fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// `t` as milliseconds since the unix epoch; negative before it.
pub fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// Milliseconds since the unix epoch as a `SystemTime` (the inverse of [`unix_ms`]); a time
/// before the epoch is the epoch.
pub fn system_time(unix_ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0))
}

/// Seconds since the unix epoch, now (the `created` field of OpenAI responses).
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A unix time in milliseconds as RFC 3339 UTC with milliseconds,
/// `2026-12-04T18:10:01.000Z`.
pub fn rfc3339_ms(unix_ms: i64) -> String {
    let t = if unix_ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(unix_ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(unix_ms.unsigned_abs())
    };
    humantime::format_rfc3339_millis(t).to_string()
}

/// A point in time as flags take it: RFC 3339 (`2026-12-05T00:00:00Z`), or a duration back
/// from `now_ms` (`24h`: a day ago). Unix milliseconds.
pub fn parse_since(text: &str, now_ms: i64) -> Result<i64, DurationError> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text.trim()) {
        return Ok(unix_ms(t));
    }
    let back = parse_duration(text).map_err(|e| match e {
        DurationError::Invalid { text, .. } => DurationError::Invalid {
            reason:
                "give an RFC 3339 time (2026-12-05T00:00:00Z) or a duration back from now (24h)"
                    .to_owned(),
            text,
        },
        other => other,
    })?;
    Ok(now_ms.saturating_sub(i64::try_from(back.as_millis()).unwrap_or(i64::MAX)))
}

/// Why a duration flag did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("{text:?} is not a duration like 30s, 15m, 12h or 7d: {reason}")]
    Invalid { text: String, reason: String },
    #[error("the duration must be more than zero")]
    Zero,
}

/// A human duration as flags take it: `30s`, `15m`, `12h`, `7d`, `1h 30m`, `250ms`, or a
/// plain number of seconds (the form earlier releases documented). Zero is refused: every
/// duration flag bounds something that must be able to happen.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let d = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| DurationError::Invalid { text: text.to_owned(), reason: e.to_string() })?
    } else {
        humantime::parse_duration(text)
            .map_err(|e| DurationError::Invalid { text: text.to_owned(), reason: e.to_string() })?
    };
    if d.is_zero() { Err(DurationError::Zero) } else { Ok(d) }
}

/// A duration as people read it: `7days`, `1h 30m`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A `Retry-After` header value (RFC 9110 §10.2.3) as the wait it asks for, read at `now`:
/// either delay-seconds (`120`) or an HTTP-date (`Wed, 21 Oct 2026 07:28:00 GMT`). A date
/// in the past means "now" (zero). `None` for anything else, which callers treat as absent.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    // Some providers send fractional seconds; RFC 9110 does not, but the intent is clear.
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    #[test]
    fn since_takes_a_time_or_a_duration_back() {
        let now = 1_796_219_557_123;
        assert_eq!(parse_since("2026-12-05T00:00:00Z", now), Ok(1_796_428_800_000));
        assert_eq!(parse_since("24h", now), Ok(now - 86_400_000));
        assert!(parse_since("yesterday", now).unwrap_err().to_string().contains("RFC 3339"));
    }

    use super::*;

    #[test]
    fn durations_take_units_and_plain_seconds() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration(" 45 "), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("0s"), Err(DurationError::Zero));
        assert_eq!(parse_duration("0"), Err(DurationError::Zero));
        assert!(matches!(parse_duration("7x"), Err(DurationError::Invalid { .. })));
        assert!(matches!(parse_duration(""), Err(DurationError::Invalid { .. })));
        assert!(matches!(parse_duration("-5s"), Err(DurationError::Invalid { .. })));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(retry_after("1.5", now), Some(Duration::from_millis(1_500)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-3", now), None);
    }

    #[test]
    fn timestamps_render_as_rfc3339_utc() {
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(unix_ms(t), 1_700_000_000_123);
    }
}
