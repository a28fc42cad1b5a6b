//! Wall-clock formatting without a date-time crate: the CLI's listings and the webhook
//! payloads both render unix milliseconds as UTC calendar time.

/// A unix time in milliseconds as UTC calendar fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utc {
    pub year: i64,
    pub month: i64,
    pub day: i64,
    pub hour: i64,
    pub minute: i64,
    pub second: i64,
    pub millis: i64,
}

impl Utc {
    pub fn from_unix_ms(unix_ms: i64) -> Self {
        let secs = unix_ms.div_euclid(1000);
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        // Civil-from-days (Howard Hinnant's algorithm, proleptic Gregorian calendar).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        Self {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
            millis: unix_ms.rem_euclid(1000),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leap_days_and_the_epoch() {
        let t = Utc::from_unix_ms(951_782_400_000);
        assert_eq!((t.year, t.month, t.day), (2000, 2, 29));
        assert_eq!(Utc::from_unix_ms(0).year, 1970);
    }
}
