//! `keys`: the key table, one key's details, and the one time a secret is shown.

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;

use super::text::{Table, ago, list_or, utc};

/// A key as scripts see it; field names follow the catalog's `ApiKeyRecord`.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub id: String,
    pub name: String,
    pub status: String,
    pub secret_hint: String,
    pub created_unix_ms: i64,
    pub updated_unix_ms: i64,
    #[serde(rename = "failoverDefaults")]
    pub failover_defaults: Option<DefaultsView>,
    pub allowed_models: Vec<String>,
    pub allowed_regions: Vec<String>,
    /// The key's own limits; `null` when it has none.
    pub limits: Option<switchyard_catalog::Limits>,
}

#[derive(Debug, Serialize)]
pub struct DefaultsView {
    pub models: Vec<String>,
    pub timeout_ms: Option<u32>,
    pub first_token_timeout_ms: Option<u32>,
    /// Empty on the wire means the default triggers; scripts get the list spelled out.
    pub on: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<DegradedView>,
    /// Whether a stream that breaks after its first token is continued (the default).
    pub continue_streams: bool,
    /// Whether a request naming a session goes to the session's deployment (the default).
    pub session_affinity: bool,
}

#[derive(Debug, Serialize)]
pub struct DegradedView {
    pub message: String,
    pub when_all_open: bool,
}

impl From<pb::ApiKey> for KeyView {
    fn from(k: pb::ApiKey) -> Self {
        Self {
            id: k.id,
            name: k.name,
            status: k.status,
            secret_hint: k.secret_hint,
            created_unix_ms: k.created_unix_ms,
            updated_unix_ms: k.updated_unix_ms,
            failover_defaults: k.failover_defaults.map(|d| DefaultsView {
                models: d.models,
                timeout_ms: d.timeout_ms,
                first_token_timeout_ms: d.first_token_timeout_ms,
                on: if d.on.is_empty() {
                    switchyard_catalog::FailoverReason::ALL
                        .iter()
                        .map(|r| r.as_str().to_owned())
                        .collect()
                } else {
                    d.on
                },
                degraded: d
                    .degraded
                    .map(|g| DegradedView { message: g.message, when_all_open: g.when_all_open }),
                continue_streams: d.continue_streams.unwrap_or(true),
                session_affinity: d.session_affinity.unwrap_or(true),
            }),
            allowed_models: k.allowed_models,
            allowed_regions: k.allowed_regions,
            limits: k.limits.map(|l| switchyard_catalog::Limits {
                rpm: l.rpm,
                tpm: l.tpm,
                tokens_per_day: l.tokens_per_day,
                usd_per_day: l.usd_per_day,
            }),
        }
    }
}

/// `60 rpm, 2000 tpm, $5/day`; `-` for none.
pub fn limits_text(l: Option<&switchyard_catalog::Limits>) -> String {
    let Some(l) = l else { return "-".to_owned() };
    let mut parts = Vec::new();
    if let Some(v) = l.rpm {
        parts.push(format!("{v} rpm"));
    }
    if let Some(v) = l.tpm {
        parts.push(format!("{v} tpm"));
    }
    if let Some(v) = l.tokens_per_day {
        parts.push(format!("{v} tokens/day"));
    }
    if let Some(v) = l.usd_per_day {
        parts.push(format!("${v}/day"));
    }
    if parts.is_empty() { "-".to_owned() } else { parts.join(", ") }
}

/// What `keys create --json` and `keys rotate --json` print: the key's fields, plus the
/// secret as `key` (docs/cli.md) and the server's warnings.
#[derive(Debug, Serialize)]
pub struct KeySecretView {
    #[serde(flatten)]
    pub key: KeyView,
    #[serde(rename = "key")]
    pub secret: String,
    pub warnings: Vec<String>,
    /// Store revision of the write: a node whose applied version reaches it has the key.
    pub version: i64,
}

#[derive(Debug, Serialize)]
pub struct KeyWithWarnings {
    #[serde(flatten)]
    pub key: KeyView,
    pub warnings: Vec<String>,
    /// Store revision of the write; 0 for reads.
    pub version: i64,
}

fn hint(secret_hint: &str) -> String {
    if secret_hint.is_empty() { "-".to_owned() } else { format!("sy-…{secret_hint}") }
}

fn chain(d: &DefaultsView) -> String {
    d.models.join(" → ")
}

pub fn keys_table(keys: &[KeyView], now_ms: i64) -> String {
    if keys.is_empty() {
        return "no keys\n".to_owned();
    }
    keys_rows(keys, now_ms, true)
}

/// One page of the key table: with its header for the first page (columns are as wide as
/// this page's widest cell; later pages align among themselves).
pub fn keys_rows(keys: &[KeyView], now_ms: i64, header: bool) -> String {
    let mut t =
        Table::new(["ID", "NAME", "STATUS", "SECRET", "DEFAULT CHAIN", "LIMITS", "CREATED"]);
    for k in keys {
        t.row(vec![
            k.id.clone(),
            k.name.clone(),
            k.status.clone(),
            hint(&k.secret_hint),
            k.failover_defaults.as_ref().map_or_else(|| "-".to_owned(), chain),
            limits_text(k.limits.as_ref()),
            ago(k.created_unix_ms, now_ms),
        ]);
    }
    let text = t.render();
    if header {
        text
    } else {
        text.split_once('\n').map_or(text.clone(), |(_, rows)| rows.to_owned())
    }
}

pub fn key_details(k: &KeyView, now_ms: i64) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("id", k.id.clone()),
        ("name", k.name.clone()),
        ("status", k.status.clone()),
        ("secret", hint(&k.secret_hint)),
        ("created", format!("{} ({})", utc(k.created_unix_ms), ago(k.created_unix_ms, now_ms))),
    ];
    if k.updated_unix_ms > 0 {
        let when = format!("{} ({})", utc(k.updated_unix_ms), ago(k.updated_unix_ms, now_ms));
        rows.push(("updated", when));
    }
    match &k.failover_defaults {
        None => rows.push(("default chain", "none (requests name their models)".to_owned())),
        Some(d) => {
            rows.push(("default chain", chain(d)));
            let ms =
                |v: Option<u32>, default: &str| v.map_or(default.to_owned(), |v| format!("{v} ms"));
            rows.push(("timeout", ms(d.timeout_ms, "default (60000 ms)")));
            rows.push(("first token timeout", ms(d.first_token_timeout_ms, "default (10000 ms)")));
            rows.push(("fails over on", d.on.join(", ")));
            if !d.continue_streams {
                rows.push(("broken streams", "end with an error frame (not continued)".to_owned()));
            }
            if !d.session_affinity {
                rows.push((
                    "session affinity",
                    "off (sessions balanced like any request)".to_owned(),
                ));
            }
            if let Some(g) = &d.degraded {
                let when = if g.when_all_open {
                    "when no model serves, at once when every breaker is open"
                } else {
                    "when no model serves"
                };
                rows.push(("degraded answer", format!("{:?} ({when})", g.message)));
            }
        }
    }
    rows.push(("limits", limits_text(k.limits.as_ref())));
    rows.push(("allowed models", list_or(&k.allowed_models, "all")));
    rows.push(("allowed regions", list_or(&k.allowed_regions, "all")));
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0) + 1;
    rows.iter().map(|(label, value)| format!("{:width$} {value}\n", format!("{label}:"))).collect()
}

/// The one time a secret is shown: it says so, because only its hash is kept.
pub fn key_secret(verb: &str, k: &KeyView, secret: &str) -> String {
    format!(
        "{verb} key {} ({})\n\n    {secret}\n\nThis secret will not be shown again: store it now. \
         Only its SHA-256 is kept.\n",
        k.id, k.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::json;

    fn key() -> KeyView {
        KeyView::from(pb::ApiKey {
            id: "key_1".into(),
            name: "app".into(),
            created_unix_ms: 1_000,
            status: "active".into(),
            secret_hint: "wxyz".into(),
            failover_defaults: Some(pb::FailoverDefaults {
                models: vec!["a".into(), "b".into()],
                timeout_ms: Some(20_000),
                first_token_timeout_ms: None,
                on: vec![],
                degraded: Some(pb::Degraded { message: "Down.".into(), when_all_open: true }),
                continue_streams: None,
                session_affinity: None,
            }),
            allowed_models: vec![],
            allowed_regions: vec!["eu".into()],
            updated_unix_ms: 0,
            limits: Some(pb::KeyLimits {
                rpm: Some(60),
                usd_per_day: Some(5.0),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn created_key_json_carries_id_name_and_secret() {
        let v = KeySecretView {
            key: key(),
            secret: "sy-secret".into(),
            warnings: vec!["w".into()],
            version: 9,
        };
        let j: serde_json::Value = serde_json::from_str(&json(&v).unwrap()).unwrap();
        assert_eq!(j["id"], "key_1");
        assert_eq!(j["name"], "app");
        assert_eq!(j["key"], "sy-secret");
        assert_eq!(j["warnings"][0], "w");
        assert_eq!(
            j["failoverDefaults"]["on"].as_array().unwrap().len(),
            switchyard_catalog::FailoverReason::ALL.len()
        );
    }

    #[test]
    fn a_shown_secret_says_it_will_not_be_shown_again() {
        let text = key_secret("Created", &key(), "sy-secret");
        assert!(text.contains("sy-secret") && text.contains("will not be shown again"), "{text}");
    }

    #[test]
    fn key_listing_shows_hint_and_chain_never_the_secret() {
        let text = keys_table(&[key()], 61_000);
        assert!(text.contains("sy-…wxyz") && text.contains("a → b") && text.contains("1m ago"));
        let details = key_details(&key(), 61_000);
        assert!(details.contains("timeout:             20000 ms"), "{details}");
        assert!(details.contains("allowed regions:     eu"), "{details}");
        assert!(details.contains("limits:              60 rpm, $5/day"), "{details}");
        assert!(
            details.contains(r#"degraded answer:     "Down." (when no model serves, at once"#),
            "{details}"
        );
    }
}
