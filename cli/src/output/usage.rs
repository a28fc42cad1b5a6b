//! `usage`: totals per key and model.

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;

use super::text::Table;

#[derive(Debug, Serialize)]
pub struct UsageView {
    pub key_id: String,
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}

impl From<pb::UsageRow> for UsageView {
    fn from(r: pb::UsageRow) -> Self {
        Self {
            key_id: r.key_id,
            model: r.model,
            requests: r.requests,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            cost_usd: r.cost_usd,
        }
    }
}

pub fn usage_table(rows: &[UsageView]) -> String {
    if rows.is_empty() {
        return "no usage recorded\n".to_owned();
    }
    let mut t =
        Table::new(["KEY", "MODEL", "REQUESTS", "PROMPT TOKENS", "COMPLETION TOKENS", "COST USD"]);
    for r in rows {
        t.row(vec![
            r.key_id.clone(),
            r.model.clone(),
            r.requests.to_string(),
            r.prompt_tokens.to_string(),
            r.completion_tokens.to_string(),
            // Nano models cost fractions of a cent per request.
            format!("{:.6}", r.cost_usd),
        ]);
    }
    t.render()
}

/// One limit of one key and what the fleet used of it in the current window.
#[derive(Debug, Serialize)]
pub struct LimitView {
    pub key_id: String,
    /// `rpm`, `tpm`, `tokens_per_day` or `usd_per_day`.
    pub limit: String,
    pub value: f64,
    pub used: f64,
    /// When the window has room again; 0 when nothing is counted.
    pub reset_unix_ms: i64,
}

impl From<pb::LimitStatus> for LimitView {
    fn from(l: pb::LimitStatus) -> Self {
        Self {
            key_id: l.key_id,
            limit: l.limit,
            value: l.value,
            used: l.used,
            reset_unix_ms: l.reset_unix_ms,
        }
    }
}

pub fn limits_table(rows: &[LimitView], now_ms: i64) -> String {
    if rows.is_empty() {
        return "no key has limits\n".to_owned();
    }
    let mut t = Table::new(["KEY", "LIMIT", "USED", "OF", "USED %", "ROOM IN"]);
    for r in rows {
        let number =
            |v: f64| if r.limit == "usd_per_day" { format!("{v:.6}") } else { format!("{v:.0}") };
        // Only a limit that is reached has to wait for room.
        let room = if r.used >= r.value && r.reset_unix_ms > now_ms {
            format!("{}s", (r.reset_unix_ms - now_ms).div_euclid(1000).max(1))
        } else {
            "-".to_owned()
        };
        t.row(vec![
            r.key_id.clone(),
            r.limit.clone(),
            number(r.used),
            number(r.value),
            format!("{:.0}%", 100.0 * r.used / r.value.max(f64::MIN_POSITIVE)),
            room,
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_table_lists_cost_to_the_micro_dollar() {
        let rows = [UsageView::from(pb::UsageRow {
            key_id: "key_1".into(),
            model: "m".into(),
            requests: 3,
            prompt_tokens: 30,
            completion_tokens: 12,
            cost_usd: 0.0000063,
        })];
        let text = usage_table(&rows);
        assert!(
            text.ends_with("key_1  m      3         30             12                 0.000006\n"),
            "{text}"
        );
    }
}
