//! `GetUsage`: usage totals from the nodes' reports, and every limited key's use of its
//! limits across the fleet.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use tonic::{Request, Response, Status};

use switchyard_catalog::ApiKeyRecord;
use switchyard_proto::admin::v1 as pb;
use switchyard_time::now_ms;

use super::service::{AdminError, AdminService, decode};
use crate::limits;
use crate::reports::{self, UsageRecord};

pub(super) async fn get_usage(
    admin: &AdminService,
    request: Request<pb::GetUsageRequest>,
) -> Result<Response<pb::GetUsageResponse>, Status> {
    let request = request.into_inner();
    let key_id = request.key_id;
    let listing = admin.store.list(&admin.layout.usage_prefix()).await.map_err(AdminError::from)?;
    // Usage since a time: each run's totals less its mark at the hour `since` falls in.
    let since = (request.since_unix_ms > 0).then(|| reports::hour(request.since_unix_ms));
    let mut marks: std::collections::HashMap<(String, String), BTreeMap<i64, UsageRecord>> =
        std::collections::HashMap::new();
    if since.is_some() {
        let listing =
            admin.store.list(&admin.layout.usage_marks_prefix()).await.map_err(AdminError::from)?;
        for kv in &listing.kvs {
            let hour = kv.key.rsplit('/').next().and_then(|h| h.parse::<i64>().ok());
            let (Some(hour), Ok(mark)) = (hour, serde_json::from_slice::<UsageRecord>(&kv.value))
            else {
                continue;
            };
            marks
                .entry((mark.node_id.clone(), mark.boot_id.clone()))
                .or_default()
                .insert(hour, mark);
        }
    }
    let none = BTreeMap::new();
    let mut totals: BTreeMap<(String, String), pb::UsageRow> = BTreeMap::new();
    for kv in &listing.kvs {
        let Ok(record) = serde_json::from_slice::<UsageRecord>(&kv.value) else {
            tracing::warn!(key = %kv.key, "unreadable usage record; skipped");
            continue;
        };
        let baseline = since.and_then(|since| {
            let run = marks.get(&(record.node_id.clone(), record.boot_id.clone()));
            reports::usage_since(&record, run.unwrap_or(&none), since)
        });
        let before = |key: &str, model: &str| {
            baseline.and_then(|b| b.entries.iter().find(|e| e.key_id == key && e.model == model))
        };
        for e in &record.entries {
            if !key_id.is_empty() && e.key_id != key_id {
                continue;
            }
            let old = before(&e.key_id, &e.model);
            let requests = e.requests.saturating_sub(old.map_or(0, |o| o.requests));
            if requests == 0 && old.is_some() {
                continue;
            }
            let row =
                totals.entry((e.key_id.clone(), e.model.clone())).or_insert_with(|| pb::UsageRow {
                    key_id: e.key_id.clone(),
                    model: e.model.clone(),
                    ..Default::default()
                });
            row.requests += requests;
            row.prompt_tokens += e.prompt_tokens.saturating_sub(old.map_or(0, |o| o.prompt_tokens));
            row.completion_tokens +=
                e.completion_tokens.saturating_sub(old.map_or(0, |o| o.completion_tokens));
            row.cost_usd += (e.cost_usd - old.map_or(0.0, |o| o.cost_usd)).max(0.0);
        }
    }
    let limits = admin.limit_status(&key_id).await?;
    Ok(Response::new(pb::GetUsageResponse { rows: totals.into_values().collect(), limits }))
}

impl AdminService {
    /// Every limited key's use of each of its limits, fleet-wide, from what the replicas
    /// published a moment ago.
    pub(super) async fn limit_status(
        &self,
        key_id: &str,
    ) -> Result<Vec<pb::LimitStatus>, AdminError> {
        let limited = self.limited_keys(key_id).await?;
        let fleet = limits::fleet_totals(self.store.as_ref(), &self.layout).await?;
        let now = now_ms();
        let now_s = now.div_euclid(1000);
        let midnight = (now_s.div_euclid(86_400) + 1) * 86_400_000;
        let mut out = Vec::new();
        for record in limited {
            let Some(l) = record.limits else { continue };
            let used = fleet.get(&record.id).cloned().unwrap_or_default();
            // The window has room again when its oldest counted second leaves it.
            let oldest = used.seconds.keys().next().map_or(0, |s| (s + 60) * 1000);
            let status = |limit: &str, value: f64, used: f64, reset: i64| pb::LimitStatus {
                key_id: record.id.clone(),
                limit: limit.to_owned(),
                value,
                used,
                reset_unix_ms: if used > 0.0 { reset } else { 0 },
            };
            if let Some(v) = l.rpm {
                out.push(status("rpm", v as f64, used.requests() as f64, oldest));
            }
            if let Some(v) = l.tpm {
                out.push(status("tpm", v as f64, used.tokens() as f64, oldest));
            }
            if let Some(v) = l.tokens_per_day {
                out.push(status("tokens_per_day", v as f64, used.day_tokens as f64, midnight));
            }
            if let Some(v) = l.usd_per_day {
                out.push(status("usd_per_day", v, used.day_micro_usd as f64 / 1e6, midnight));
            }
        }
        Ok(out)
    }
}

impl AdminService {
    /// The keys with limits (`key_id`: that key only, read on its own). All keys are read a
    /// slice at a time and only the limited ones kept: a fleet of a million keys is not
    /// held in memory to find its few limited ones.
    pub(super) async fn limited_keys(&self, key_id: &str) -> Result<Vec<ApiKeyRecord>, AdminError> {
        if !key_id.is_empty() {
            let Some(kv) = self.store.get(&self.layout.key(key_id)).await? else {
                return Ok(Vec::new());
            };
            let record: ApiKeyRecord = decode(&kv.value, "API key")?;
            return Ok(record.limits.is_some().then_some(record).into_iter().collect());
        }
        let mut limited = Vec::new();
        self.scan_keys(|record| {
            if record.limits.is_some() {
                limited.push(record);
            }
            ControlFlow::Continue(())
        })
        .await?;
        Ok(limited)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use switchyard_catalog::KeyStatus;
    use switchyard_catalog::keys::hash_secret;

    use super::*;
    use crate::admin::service::{KEYS_SLICE, testing};
    use crate::store::{Txn, TxnOp};

    #[tokio::test]
    async fn limit_status_finds_the_limited_keys_among_slices_of_many() {
        let dir = tempfile::tempdir().unwrap();
        let admin = testing::service(dir.path()).await;
        // More than two slices of keys, three of them limited, spread over the slices.
        let mut ops = Vec::new();
        for i in 0..(2 * KEYS_SLICE + 10) {
            let limits = [3, KEYS_SLICE + 1, 2 * KEYS_SLICE + 9]
                .contains(&i)
                .then_some(switchyard_catalog::Limits { rpm: Some(60), ..Default::default() });
            let record = ApiKeyRecord {
                id: format!("key_{i:05}"),
                name: "n".into(),
                created_unix_ms: 1,
                updated_unix_ms: 1,
                status: KeyStatus::Active,
                secret_sha256: hash_secret(&format!("s{i}")),
                secret_hint: "abcd".into(),
                failover_defaults: None,
                allowed_models: vec![],
                allowed_regions: vec![],
                limits,
            };
            let value = serde_json::to_vec(&record).unwrap();
            ops.push(TxnOp::Put { key: admin.layout.key(&record.id), value, lease: None });
            if ops.len() == 128 {
                admin
                    .store
                    .txn(Txn { success: std::mem::take(&mut ops), ..Txn::default() })
                    .await
                    .unwrap();
            }
        }
        admin.store.txn(Txn { success: ops, ..Txn::default() }).await.unwrap();
        let ids =
            |rows: Vec<pb::LimitStatus>| rows.into_iter().map(|r| r.key_id).collect::<Vec<_>>();
        assert_eq!(
            ids(admin.limit_status("").await.unwrap()),
            ["key_00003", "key_01001", "key_02009"]
        );
        assert_eq!(ids(admin.limit_status("key_01001").await.unwrap()), ["key_01001"]);
        assert!(admin.limit_status("key_00004").await.unwrap().is_empty(), "no limits");
        assert!(admin.limit_status("key_nope").await.unwrap().is_empty(), "no such key");
    }
}
