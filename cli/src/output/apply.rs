//! `apply` (and the webhook edits that apply the catalog): the changes, then what happened.

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct ApplyView {
    pub changes: Vec<String>,
    pub applied: bool,
    pub dry_run: bool,
    pub version: i64,
}

pub fn apply_result(v: &ApplyView) -> String {
    let mut out: String = v.changes.iter().map(|c| format!("{c}\n")).collect();
    if v.changes.is_empty() {
        out.push_str("no changes\n");
    }
    if v.dry_run {
        out.push_str("dry run: nothing was applied\n");
    } else if v.applied {
        out.push_str(&format!("applied: catalog version {}\n", v.version));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_says_no_changes_and_dry_run() {
        let v = ApplyView { changes: vec![], applied: false, dry_run: true, version: 0 };
        assert_eq!(apply_result(&v), "no changes\ndry run: nothing was applied\n");
        let v = ApplyView {
            changes: vec!["+ models/x".into(), "- webhooks/oncall".into()],
            applied: true,
            dry_run: false,
            version: 7,
        };
        assert_eq!(apply_result(&v), "+ models/x\n- webhooks/oncall\napplied: catalog version 7\n");
    }
}
