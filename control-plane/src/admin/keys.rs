//! API keys: create, list (and find by secret), read, revoke, rotate, set defaults and
//! limits; each write a compare-and-swap on the revision read, with the key's secret-index
//! entry in the same transaction.

use std::sync::Arc;

use rand::Rng;
use tonic::{Request, Response, Status};
use tracing::info;

use switchyard_catalog::keys::{SECRET_PREFIX, hash_secret};
use switchyard_catalog::{
    ApiKeyRecord, Degraded, FailoverDefaults, FailoverReason, FieldError, KeyStatus, Limits,
    ValidationErrors,
};
use switchyard_proto::admin::v1 as pb;
use switchyard_time::now_ms;

use super::service::{AdminError, AdminService, decode, invalid};
use crate::layout::Layout;
use crate::paging;
use crate::store::{Compare, Revision, Store, Txn, TxnOp};

impl AdminService {
    pub(super) async fn load_key(&self, id: &str) -> Result<(ApiKeyRecord, Revision), AdminError> {
        if id.is_empty() {
            return Err(invalid("id", "must not be empty"));
        }
        let kv = self
            .store
            .get(&self.layout.key(id))
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("no API key with id {id:?}")))?;
        Ok((decode(&kv.value, "API key")?, kv.mod_revision))
    }

    /// Stores `record` if the key is still at `expected` (0: does not exist yet), with its
    /// secret-index entry in the same transaction; `previous_sha256` is the secret hash it
    /// had (a rotation's old one, whose entry goes).
    pub(super) async fn save_key(
        &self,
        record: &ApiKeyRecord,
        expected: Revision,
        previous_sha256: Option<&str>,
    ) -> Result<Revision, AdminError> {
        let key = self.layout.key(&record.id);
        let value = serde_json::to_vec(record)
            .map_err(|e| AdminError::Corrupt { what: "API key".into(), reason: e.to_string() })?;
        let mut success = vec![
            TxnOp::Put { key: key.clone(), value, lease: None },
            TxnOp::Put {
                key: self.layout.key_secret(&record.secret_sha256),
                value: record.id.clone().into_bytes(),
                lease: None,
            },
        ];
        if let Some(old) = previous_sha256.filter(|old| *old != record.secret_sha256) {
            success.push(TxnOp::Delete { key: self.layout.key_secret(old) });
        }
        let result = self
            .store
            .txn(Txn {
                compare: vec![Compare::mod_revision(key.clone(), expected)],
                success,
                failure: vec![],
            })
            .await?;
        if result.succeeded {
            Ok(result.revision)
        } else {
            Err(AdminError::Conflict(format!(
                "API key {} changed while this request ran; try again",
                record.id
            )))
        }
    }

    /// Checks a key's defaults and allow-lists against the catalog.
    pub(super) async fn check_key_settings(
        &self,
        defaults: Option<pb::FailoverDefaults>,
        allowed_models: &[String],
        allowed_regions: &[String],
    ) -> Result<(Option<FailoverDefaults>, Vec<String>), AdminError> {
        let (catalog, _) = self.load_catalog().await?;
        let mut errors = Vec::new();
        // A name the catalog serves: an entry (a wildcard too, by its own name), or a name
        // under a wildcard (`openai/gpt-5`, a narrower `openai/ft/*`).
        for (i, model) in allowed_models.iter().enumerate() {
            if catalog.resolve(model).is_none() {
                errors.push(FieldError::new(
                    format!("allowed_models[{i}]"),
                    format!("unknown model {model:?}: not in the catalog nor under a wildcard"),
                ));
            }
        }
        for (i, region) in allowed_regions.iter().enumerate() {
            if region.trim().is_empty() {
                errors.push(FieldError::new(format!("allowed_regions[{i}]"), "must not be empty"));
            }
        }
        let normalized = match defaults {
            None => None,
            Some(d) => match defaults_from_pb(d) {
                Err(e) => {
                    errors.extend(e.0);
                    None
                }
                Ok(d) => match d.normalize(|m| catalog.resolve(m).is_some()) {
                    Ok(ok) => match ok.0.check_kinds(|m| Some(catalog.resolve(m)?.chain_kind())) {
                        Ok(()) => Some(ok),
                        Err(e) => {
                            errors.push(e);
                            None
                        }
                    },
                    Err(e) => {
                        errors.extend(e.0);
                        None
                    }
                },
            },
        };
        if !errors.is_empty() {
            return Err(ValidationErrors(errors).into());
        }
        Ok(match normalized {
            Some((d, warnings)) => (Some(d), warnings),
            None => (None, Vec::new()),
        })
    }
}

pub(super) async fn create_key(
    admin: &AdminService,
    request: Request<pb::CreateKeyRequest>,
) -> Result<Response<pb::KeySecretResponse>, Status> {
    let request = request.into_inner();
    let name = request.name.trim().to_owned();
    if name.is_empty() {
        return Err(invalid("name", "must not be empty").into());
    }
    let (failover_defaults, warnings) = admin
        .check_key_settings(
            request.failover_defaults,
            &request.allowed_models,
            &request.allowed_regions,
        )
        .await?;
    let secret = new_secret();
    let now = now_ms();
    let record = ApiKeyRecord {
        id: new_key_id(),
        name,
        created_unix_ms: now,
        updated_unix_ms: now,
        status: KeyStatus::Active,
        secret_sha256: hash_secret(&secret),
        secret_hint: hint(&secret),
        failover_defaults,
        allowed_models: request.allowed_models,
        allowed_regions: request.allowed_regions,
        limits: None,
    };
    let version = admin.save_key(&record, 0, None).await?;
    info!(key = %record.id, "API key created");
    Ok(Response::new(pb::KeySecretResponse {
        key: Some(key_to_pb(&record)),
        secret,
        warnings,
        version,
    }))
}

pub(super) async fn list_keys(
    admin: &AdminService,
    request: Request<pb::ListKeysRequest>,
) -> Result<Response<pb::ListKeysResponse>, Status> {
    let request = request.into_inner();
    let status = match request.status.as_str() {
        "" => None,
        "active" => Some(KeyStatus::Active),
        "revoked" => Some(KeyStatus::Revoked),
        other => {
            let message = format!("{other:?} is not a key status; expected active or revoked");
            return Err(invalid("status", message).into());
        }
    };
    if !request.secret_sha256.is_empty() {
        // At most one key: the filters still apply; there is nothing to page.
        let wanted = request.secret_sha256.to_ascii_lowercase();
        let found = admin.key_by_secret(&wanted).await?;
        let keys = found
            .iter()
            .filter(|r| {
                status.is_none_or(|s| r.status == s)
                    && r.name.starts_with(request.name_prefix.as_str())
                    && r.id.starts_with(request.id_prefix.as_str())
            })
            .map(key_to_pb)
            .collect();
        return Ok(Response::new(pb::ListKeysResponse { keys, next_page_token: String::new() }));
    }
    let mode = paging::mode(paging::Listing::Keys, request.limit, &request.page_token)
        .map_err(AdminError::from)?;
    let name_prefix = request.name_prefix;
    let page = paging::scan(
        admin.store.as_ref(),
        paging::Listing::Keys,
        &admin.layout.keys_prefix(),
        &request.id_prefix,
        &mode,
        |kv| {
            let record: ApiKeyRecord = decode(&kv.value, "API key")?;
            let wanted = status.is_none_or(|s| record.status == s)
                && record.name.starts_with(name_prefix.as_str());
            Ok::<_, AdminError>(wanted.then(|| key_to_pb(&record)))
        },
        prost::Message::encoded_len,
    )
    .await?;
    Ok(Response::new(pb::ListKeysResponse { keys: page.items, next_page_token: page.next_token }))
}

pub(super) async fn get_key(
    admin: &AdminService,
    request: Request<pb::KeyIdRequest>,
) -> Result<Response<pb::KeyResponse>, Status> {
    let (record, _) = admin.load_key(&request.into_inner().id).await?;
    Ok(Response::new(pb::KeyResponse {
        key: Some(key_to_pb(&record)),
        warnings: vec![],
        version: 0,
    }))
}

pub(super) async fn revoke_key(
    admin: &AdminService,
    request: Request<pb::KeyIdRequest>,
) -> Result<Response<pb::KeyResponse>, Status> {
    let (mut record, rev) = admin.load_key(&request.into_inner().id).await?;
    if record.status == KeyStatus::Revoked {
        return Ok(Response::new(pb::KeyResponse {
            key: Some(key_to_pb(&record)),
            warnings: vec!["key was already revoked".into()],
            version: 0,
        }));
    }
    record.status = KeyStatus::Revoked;
    record.updated_unix_ms = now_ms();
    let version = admin.save_key(&record, rev, None).await?;
    info!(key = %record.id, "API key revoked");
    Ok(Response::new(pb::KeyResponse { key: Some(key_to_pb(&record)), warnings: vec![], version }))
}

pub(super) async fn rotate_key(
    admin: &AdminService,
    request: Request<pb::KeyIdRequest>,
) -> Result<Response<pb::KeySecretResponse>, Status> {
    let (mut record, rev) = admin.load_key(&request.into_inner().id).await?;
    if record.status == KeyStatus::Revoked {
        return Err(AdminError::FailedPrecondition(format!(
            "API key {} is revoked; create a new key instead",
            record.id
        ))
        .into());
    }
    let secret = new_secret();
    let previous = std::mem::replace(&mut record.secret_sha256, hash_secret(&secret));
    record.secret_hint = hint(&secret);
    record.updated_unix_ms = now_ms();
    let version = admin.save_key(&record, rev, Some(&previous)).await?;
    info!(key = %record.id, "API key rotated");
    Ok(Response::new(pb::KeySecretResponse {
        key: Some(key_to_pb(&record)),
        secret,
        warnings: vec![],
        version,
    }))
}

pub(super) async fn set_key_defaults(
    admin: &AdminService,
    request: Request<pb::SetKeyDefaultsRequest>,
) -> Result<Response<pb::KeyResponse>, Status> {
    let request = request.into_inner();
    let (mut record, rev) = admin.load_key(&request.id).await?;
    let (defaults, warnings) =
        admin.check_key_settings(request.failover_defaults, &[], &[]).await?;
    record.failover_defaults = defaults;
    record.updated_unix_ms = now_ms();
    let version = admin.save_key(&record, rev, None).await?;
    info!(key = %record.id, "API key defaults set");
    Ok(Response::new(pb::KeyResponse { key: Some(key_to_pb(&record)), warnings, version }))
}

pub(super) async fn set_key_limits(
    admin: &AdminService,
    request: Request<pb::SetKeyLimitsRequest>,
) -> Result<Response<pb::KeyResponse>, Status> {
    let request = request.into_inner();
    let limits = request.limits.map(|l| Limits {
        rpm: l.rpm,
        tpm: l.tpm,
        tokens_per_day: l.tokens_per_day,
        usd_per_day: l.usd_per_day,
    });
    if let Some(limits) = &limits {
        limits.validate().map_err(AdminError::from)?;
    }
    let (mut record, rev) = admin.load_key(&request.id).await?;
    record.limits = limits.filter(|l| !l.is_empty());
    record.updated_unix_ms = now_ms();
    let version = admin.save_key(&record, rev, None).await?;
    info!(key = %record.id, "API key limits set");
    Ok(Response::new(pb::KeyResponse { key: Some(key_to_pb(&record)), warnings: vec![], version }))
}

impl AdminService {
    /// The key whose secret hashes to `sha256` (lower-case hex), from the secret index.
    /// Keys stored before the index existed have no entry: until one lookup has filled the
    /// index in (and marked it complete), a miss reads the keys a slice at a time.
    pub(super) async fn key_by_secret(
        &self,
        sha256: &str,
    ) -> Result<Option<ApiKeyRecord>, AdminError> {
        // Not a SHA-256: no key has it (and it must not reach into other store keys).
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        if let Some(entry) = self.store.get(&self.layout.key_secret(sha256)).await? {
            let id = String::from_utf8_lossy(&entry.value);
            if let Some(kv) = self.store.get(&self.layout.key(&id)).await? {
                let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                // An entry left by a race with a rotation names a key whose secret moved on.
                if record.secret_sha256 == sha256 {
                    return Ok(Some(record));
                }
            }
        }
        if self.store.get(&self.layout.key_secrets_complete()).await?.is_some() {
            return Ok(None);
        }
        self.spawn_backfill();
        let mut mode = paging::Mode::Paged { limit: 1, after: None };
        loop {
            let page = paging::scan(
                self.store.as_ref(),
                paging::Listing::Keys,
                &self.layout.keys_prefix(),
                "",
                &mode,
                |kv| {
                    let record: ApiKeyRecord = decode(&kv.value, "API key")?;
                    Ok::<_, AdminError>((record.secret_sha256 == sha256).then_some(record))
                },
                |_| 0,
            )
            .await?;
            if let Some(found) = page.items.into_iter().next() {
                return Ok(Some(found));
            }
            if page.next_token.is_empty() {
                return Ok(None);
            }
            let after = paging::decode_token(paging::Listing::Keys, &page.next_token)?;
            mode = paging::Mode::Paged { limit: 1, after: Some(after) };
        }
    }

    /// Writes the secret-index entry of every stored key, then the mark that the index is
    /// complete; in the background, one at a time per service (its clones, the console's,
    /// share it). Entries are written unconditionally: an entry maps a hash to the key that
    /// had it, so writing it twice, or after a rotation moved the key on, is harmless
    /// (lookups check the key's hash).
    fn spawn_backfill(&self) {
        use std::sync::atomic::Ordering;
        if self.backfilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (store, layout) = (Arc::clone(&self.store), self.layout.clone());
        let backfilling = Arc::clone(&self.backfilling);
        tokio::spawn(async move {
            let result = backfill_secret_index(store.as_ref(), &layout).await;
            backfilling.store(false, Ordering::Release);
            match result {
                Ok(keys) => info!(keys, "secret index of API keys complete"),
                Err(e) => {
                    tracing::warn!(error = %e, "filling in the secret index of API keys failed; the next lookup that misses tries again")
                }
            }
        });
    }
}

async fn backfill_secret_index(store: &dyn Store, layout: &Layout) -> Result<usize, AdminError> {
    let prefix = layout.keys_prefix();
    let mut from = prefix.clone();
    let mut count = 0;
    loop {
        let slice = store.list_page(&prefix, &from, crate::layout::MAX_TXN_OPS).await?;
        let Some(last) = slice.kvs.last() else { break };
        from = format!("{}\0", last.key);
        let mut success = Vec::with_capacity(slice.kvs.len());
        for kv in &slice.kvs {
            let record: ApiKeyRecord = decode(&kv.value, "API key")?;
            success.push(TxnOp::Put {
                key: layout.key_secret(&record.secret_sha256),
                value: record.id.into_bytes(),
                lease: None,
            });
        }
        count += success.len();
        store.txn(Txn { success, ..Txn::default() }).await?;
    }
    store.put(&layout.key_secrets_complete(), b"1".to_vec(), None).await?;
    Ok(count)
}

fn defaults_from_pb(d: pb::FailoverDefaults) -> Result<FailoverDefaults, ValidationErrors> {
    let mut errors = Vec::new();
    let mut on = Vec::new();
    for (i, text) in d.on.iter().enumerate() {
        match FailoverReason::parse(text) {
            Some(reason) => on.push(reason),
            None => errors.push(FieldError::new(
                format!("failoverDefaults.on[{i}]"),
                format!("unknown trigger {text:?}; expected {}", FailoverReason::accepted_list()),
            )),
        }
    }
    if !errors.is_empty() {
        return Err(ValidationErrors(errors));
    }
    Ok(FailoverDefaults {
        models: d.models,
        timeout_ms: d.timeout_ms,
        first_token_timeout_ms: d.first_token_timeout_ms,
        on: if on.is_empty() { None } else { Some(on) },
        degraded: d
            .degraded
            .map(|d| Degraded { message: d.message, when_all_open: d.when_all_open }),
        continue_streams: d.continue_streams,
        session_affinity: d.session_affinity,
    })
}

pub fn key_to_pb(r: &ApiKeyRecord) -> pb::ApiKey {
    pb::ApiKey {
        id: r.id.clone(),
        name: r.name.clone(),
        created_unix_ms: r.created_unix_ms,
        updated_unix_ms: r.updated_unix_ms,
        status: r.status.as_str().to_owned(),
        secret_hint: r.secret_hint.clone(),
        failover_defaults: r.failover_defaults.as_ref().map(|d| pb::FailoverDefaults {
            models: d.models.clone(),
            timeout_ms: d.timeout_ms,
            first_token_timeout_ms: d.first_token_timeout_ms,
            on: d.on.iter().flatten().map(|r| r.as_str().to_owned()).collect(),
            degraded: d.degraded.as_ref().map(|d| pb::Degraded {
                message: d.message.clone(),
                when_all_open: d.when_all_open,
            }),
            continue_streams: d.continue_streams,
            session_affinity: d.session_affinity,
        }),
        allowed_models: r.allowed_models.clone(),
        allowed_regions: r.allowed_regions.clone(),
        limits: r.limits.map(|l| pb::KeyLimits {
            rpm: l.rpm,
            tpm: l.tpm,
            tokens_per_day: l.tokens_per_day,
            usd_per_day: l.usd_per_day,
        }),
    }
}

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn random_text(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| char::from(ALPHANUMERIC[rng.random_range(0..ALPHANUMERIC.len())])).collect()
}

/// `sy-` and 40 alphanumerics: about 238 bits from the OS-seeded CSPRNG.
fn new_secret() -> String {
    format!("{SECRET_PREFIX}{}", random_text(40))
}

fn new_key_id() -> String {
    format!("key_{}", random_text(16).to_ascii_lowercase())
}

fn hint(secret: &str) -> String {
    secret.chars().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use switchyard_proto::admin::v1::admin_server::Admin;

    use super::*;
    use crate::admin::service::testing;

    #[test]
    fn defaults_take_invalid_output_in_on_and_name_an_unknown_trigger() {
        let pb_defaults = |on: &[&str]| pb::FailoverDefaults {
            models: vec!["a".into()],
            on: on.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        let d = defaults_from_pb(pb_defaults(&["timeout", "invalid_output"])).unwrap();
        assert_eq!(d.on, Some(vec![FailoverReason::Timeout, FailoverReason::InvalidOutput]));
        let e = defaults_from_pb(pb_defaults(&["timeout", "bad_json"])).unwrap_err();
        assert_eq!(e.0[0].path, "failoverDefaults.on[1]");
        assert!(e.0[0].message.contains("context_length or invalid_output"), "{}", e.0[0].message);
    }

    async fn create(admin: &AdminService, name: &str) -> pb::KeySecretResponse {
        let request = pb::CreateKeyRequest { name: name.into(), ..Default::default() };
        admin.create_key(Request::new(request)).await.unwrap().into_inner()
    }

    async fn by_secret(admin: &AdminService, secret: &str) -> Vec<String> {
        let request =
            pb::ListKeysRequest { secret_sha256: hash_secret(secret), ..Default::default() };
        let reply = admin.list_keys(Request::new(request)).await.unwrap().into_inner();
        reply.keys.into_iter().map(|k| k.id).collect()
    }

    #[tokio::test]
    async fn a_key_is_found_by_its_secret_through_the_index_and_a_rotation_moves_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let admin = testing::service(dir.path()).await;
        let created = create(&admin, "app").await;
        let id = created.key.unwrap().id;
        let index = admin.layout.key_secret(&hash_secret(&created.secret));
        let entry = admin.store.get(&index).await.unwrap().unwrap();
        assert_eq!(entry.value.as_ref(), id.as_bytes(), "written with the key");
        assert_eq!(by_secret(&admin, &created.secret).await, std::slice::from_ref(&id));

        let rotated =
            admin.rotate_key(Request::new(pb::KeyIdRequest { id: id.clone() })).await.unwrap();
        let new_secret = rotated.into_inner().secret;
        assert!(admin.store.get(&index).await.unwrap().is_none(), "the old entry goes");
        // The index is complete (every key was written with its entry), so a miss is final.
        admin.store.put(&admin.layout.key_secrets_complete(), b"1".to_vec(), None).await.unwrap();
        assert!(by_secret(&admin, &created.secret).await.is_empty());
        assert_eq!(by_secret(&admin, &new_secret).await, std::slice::from_ref(&id));
        assert!(by_secret(&admin, "not-a-secret").await.is_empty());
        // The listing's filters apply to the key found by its secret too.
        let filtered = |status: &str, name_prefix: &str| pb::ListKeysRequest {
            secret_sha256: hash_secret(&new_secret),
            status: status.into(),
            name_prefix: name_prefix.into(),
            ..Default::default()
        };
        for (request, found) in [
            (filtered("active", "ap"), true),
            (filtered("revoked", ""), false),
            (filtered("", "other"), false),
        ] {
            let reply = admin.list_keys(Request::new(request)).await.unwrap().into_inner();
            assert_eq!(reply.keys.len(), usize::from(found));
        }
        let bad = filtered("gone", "");
        let e = admin.list_keys(Request::new(bad)).await.unwrap_err();
        assert!(e.message().contains("status"), "{e:?}");
    }

    /// A key as releases before the secret index stored it: no index entry.
    fn key_from_before_the_index() -> ApiKeyRecord {
        ApiKeyRecord {
            id: "key_old".into(),
            name: "old".into(),
            created_unix_ms: 1,
            updated_unix_ms: 1,
            status: KeyStatus::Active,
            secret_sha256: hash_secret("sy-old-secret"),
            secret_hint: "cret".into(),
            failover_defaults: None,
            allowed_models: vec![],
            allowed_regions: vec![],
            limits: None,
        }
    }

    #[tokio::test]
    async fn a_key_stored_before_the_index_is_found_and_the_index_filled_in() {
        let dir = tempfile::tempdir().unwrap();
        let admin = testing::service(dir.path()).await;
        let created = create(&admin, "new").await;
        let old = key_from_before_the_index();
        let value = serde_json::to_vec(&old).unwrap();
        admin.store.put(&admin.layout.key("key_old"), value, None).await.unwrap();

        assert_eq!(by_secret(&admin, "sy-old-secret").await, ["key_old"]);
        let complete = admin.layout.key_secrets_complete();
        let store = Arc::clone(&admin.store);
        for _ in 0..500 {
            if store.get(&complete).await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(store.get(&complete).await.unwrap().is_some(), "the backfill finished");
        let entry = store.get(&admin.layout.key_secret(&old.secret_sha256)).await.unwrap();
        assert_eq!(entry.unwrap().value.as_ref(), b"key_old");
        assert_eq!(by_secret(&admin, "sy-old-secret").await, ["key_old"]);
        assert_eq!(by_secret(&admin, &created.secret).await.len(), 1);
    }

    #[tokio::test]
    async fn a_backfill_under_way_in_one_service_does_not_hold_back_another() {
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = testing::service(dir_a.path()).await;
        let b = testing::service(dir_b.path()).await;
        // `a` is filling in its index; `b`, on another store, has a key from before the index.
        a.backfilling.store(true, std::sync::atomic::Ordering::Release);
        let old = key_from_before_the_index();
        let value = serde_json::to_vec(&old).unwrap();
        b.store.put(&b.layout.key("key_old"), value, None).await.unwrap();

        assert_eq!(by_secret(&b, "sy-old-secret").await, ["key_old"]);
        let complete = b.layout.key_secrets_complete();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while b.store.get(&complete).await.unwrap().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "b's backfill never finished");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(a.store.get(&a.layout.key_secrets_complete()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn list_keys_filters_by_status_name_and_id_prefix_and_refuses_a_bad_status() {
        let dir = tempfile::tempdir().unwrap();
        let admin = testing::service(dir.path()).await;
        let mut ids = Vec::new();
        for name in ["team-a", "team-b", "other"] {
            ids.push(create(&admin, name).await.key.unwrap().id);
        }
        admin.revoke_key(Request::new(pb::KeyIdRequest { id: ids[1].clone() })).await.unwrap();
        let list = |request: pb::ListKeysRequest| {
            let admin = &admin;
            async move {
                let reply = admin.list_keys(Request::new(request)).await.unwrap().into_inner();
                let mut names: Vec<String> = reply.keys.into_iter().map(|k| k.name).collect();
                names.sort();
                (names, reply.next_page_token)
            }
        };
        let all = list(pb::ListKeysRequest::default()).await;
        assert_eq!(all, (vec!["other".into(), "team-a".into(), "team-b".into()], String::new()));
        let active = pb::ListKeysRequest { status: "active".into(), ..Default::default() };
        assert_eq!(list(active).await.0, ["other", "team-a"]);
        let revoked_team = pb::ListKeysRequest {
            status: "revoked".into(),
            name_prefix: "team".into(),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(list(revoked_team).await.0, ["team-b"]);
        let by_id = pb::ListKeysRequest { id_prefix: ids[2].clone(), ..Default::default() };
        assert_eq!(list(by_id).await.0, ["other"]);
        let bad = pb::ListKeysRequest { status: "expired".into(), ..Default::default() };
        let status = admin.list_keys(Request::new(bad)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("status: "), "{}", status.message());
        let bad = pb::ListKeysRequest { page_token: "nonsense".into(), ..Default::default() };
        let status = admin.list_keys(Request::new(bad)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("page_token: "), "{}", status.message());
    }
}
