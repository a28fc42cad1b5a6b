//! Building blocks of the text output: aligned tables, ages, UTC times, lists.

/// A plain text table: columns padded to their widest cell, two spaces apart.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(headers: [&str; N]) -> Self {
        Self { rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count()));
            }
            // Padding of the last column is invisible but breaks `diff` and copy/paste.
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `3s ago`, `5m ago`, `2h ago`, `4d ago`; `never` for an unset (0) timestamp.
pub fn ago(unix_ms: i64, now_ms: i64) -> String {
    if unix_ms <= 0 {
        return "never".to_owned();
    }
    // A clock slightly ahead of ours is "just now", not a negative age.
    let secs = (now_ms - unix_ms).max(0) / 1000;
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86_400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

/// `2026-12-02 13:52:37 UTC`: the RFC 3339 time, read more easily (seconds, no `T`).
pub fn utc(unix_ms: i64) -> String {
    let rfc3339 = switchyard_time::rfc3339_ms(unix_ms);
    // `2026-12-02T13:52:37.000Z`: the date, then the time of day to the second.
    match (rfc3339.get(..10), rfc3339.get(11..19)) {
        (Some(date), Some(time)) => format!("{date} {time} UTC"),
        _ => rfc3339,
    }
}

/// The items joined with ", ", or `empty` when there are none.
pub fn list_or(items: &[String], empty: &str) -> String {
    if items.is_empty() { empty.to_owned() } else { items.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_are_aligned_without_trailing_spaces() {
        let mut t = Table::new(["ID", "NAME", "CHAIN"]);
        t.row(vec!["k1".into(), "a-long-name".into(), "a → b".into()]);
        t.row(vec!["key-22".into(), "x".into(), "-".into()]);
        assert_eq!(
            t.render(),
            "ID      NAME         CHAIN\n\
             k1      a-long-name  a → b\n\
             key-22  x            -\n"
        );
    }

    #[test]
    fn ages_read_as_people_say_them() {
        let now = 1_000_000_000;
        assert_eq!(ago(now - 3_400, now), "3s ago");
        assert_eq!(ago(now - 125_000, now), "2m ago");
        assert_eq!(ago(now - 7_200_000, now), "2h ago");
        assert_eq!(ago(now - 3 * 86_400_000, now), "3d ago");
        assert_eq!(ago(now + 5_000, now), "0s ago");
        assert_eq!(ago(0, now), "never");
    }

    #[test]
    fn utc_timestamps_are_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_219_557_000), "2026-12-02 13:52:37 UTC");
    }
}
