//! `ApplyCatalog` and `GetCatalog`: the catalog in the store, applied as a compare-and-swap
//! on the version that was read.

use std::ops::ControlFlow;

use tonic::{Request, Response, Status};
use tracing::info;

use switchyard_catalog::{Catalog, FieldError, KeyStatus, ValidationErrors};
use switchyard_proto::admin::v1 as pb;

use super::service::{AdminError, AdminService};
use crate::store::{Compare, Txn, TxnOp};
use crate::webhooks::SubscriptionState;

pub(super) async fn apply_catalog(
    admin: &AdminService,
    request: Request<pb::ApplyCatalogRequest>,
) -> Result<Response<pb::ApplyCatalogResponse>, Status> {
    let request = request.into_inner();
    let deserializer = &mut serde_json::Deserializer::from_str(&request.catalog_json);
    let mut new: Catalog = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        AdminError::from(ValidationErrors(vec![FieldError::new(path, e.into_inner().to_string())]))
    })?;
    let (old, old_rev) = admin.load_catalog().await?;
    new.restore_redacted(&old);
    new.validate_for_store().map_err(AdminError::from)?;
    if let Some(expected) = request.expected_version
        && expected != old_rev
    {
        return Err(AdminError::Conflict(format!(
            "the catalog changed since it was read (version {expected}, now {old_rev}); nothing was applied, try again"
        ))
        .into());
    }
    // A change that makes a key's default chain mix chat and embedding models, or
    // dimensions, is refused naming the key: no key is left with a chain no request can
    // use (docs/catalog.md, "`models`").
    let broken = admin.keys_broken_by(&old, &new).await?;
    if !broken.is_empty() {
        return Err(AdminError::from(ValidationErrors(broken)).into());
    }
    let changes = old.diff(&new);
    if request.dry_run || changes.is_empty() {
        return Ok(Response::new(pb::ApplyCatalogResponse { changes, applied: false, version: 0 }));
    }
    let key = admin.layout.catalog();
    let value = serde_json::to_vec(&new)
        .map_err(|e| AdminError::Corrupt { what: "catalog".into(), reason: e.to_string() })?;
    let mut success = vec![TxnOp::Put { key: key.clone(), value, lease: None }];
    // A new subscription's delivery starts at the catalog before it: every event stored
    // after this apply is queued for it (writers guard on the catalog's revision), and
    // this cursor makes the delivery leader take them all, however late its own cache
    // sees the subscription (docs/webhooks.md, "A new subscription").
    // (Within one transaction's operations; more new subscriptions at once start, as
    // before, after the catalog their leader first sees.)
    let added = new.webhooks.iter().filter(|w| !old.webhooks.iter().any(|o| o.name == w.name));
    for webhook in added.take(crate::layout::MAX_TXN_OPS - 1) {
        let state = SubscriptionState { cursor: old_rev, ..Default::default() };
        let value = serde_json::to_vec(&state).map_err(|e| AdminError::Corrupt {
            what: "webhook state".into(),
            reason: e.to_string(),
        })?;
        success.push(TxnOp::Put {
            key: admin.layout.webhook_state(&webhook.name),
            value,
            lease: None,
        });
    }
    let result = admin
        .store
        .txn(Txn {
            compare: vec![Compare::mod_revision(key.clone(), old_rev)],
            success,
            failure: vec![],
        })
        .await
        .map_err(AdminError::from)?;
    if !result.succeeded {
        return Err(AdminError::Conflict(
            "the catalog changed while this apply ran; nothing was applied, try again".into(),
        )
        .into());
    }
    info!(version = result.revision, changes = changes.len(), "catalog applied");
    Ok(Response::new(pb::ApplyCatalogResponse { changes, applied: true, version: result.revision }))
}

pub(super) async fn get_catalog(
    admin: &AdminService,
    _request: Request<pb::GetCatalogRequest>,
) -> Result<Response<pb::GetCatalogResponse>, Status> {
    let (catalog, version) = admin.load_catalog().await?;
    // Credentials in webhook URLs are not shown; an apply of what was read puts them
    // back (`Catalog::restore_redacted`).
    let catalog_json = serde_json::to_string(&catalog.redacted())
        .map_err(|e| AdminError::Corrupt { what: "catalog".into(), reason: e.to_string() })?;
    Ok(Response::new(pb::GetCatalogResponse { catalog_json, version }))
}

impl AdminService {
    /// The keys whose `failoverDefaults` chain `new` would make mix model kinds or
    /// dimensions, each as the error that names it (at most [`BROKEN_SHOWN`]). Keys are
    /// read only when some name's kind changes, a slice at a time.
    pub(super) async fn keys_broken_by(
        &self,
        old: &Catalog,
        new: &Catalog,
    ) -> Result<Vec<FieldError>, AdminError> {
        let kind = |c: &Catalog, name: &str| c.resolve(name).map(|m| m.chain_kind());
        let changed = old.models.iter().chain(&new.models).any(|m| {
            switchyard_catalog::wildcard_prefix(&m.name).is_none()
                && kind(old, &m.name).is_some()
                && kind(old, &m.name) != kind(new, &m.name)
        });
        if !changed {
            return Ok(Vec::new());
        }
        let mut broken = Vec::new();
        self.scan_keys(|record| {
            let Some(defaults) = &record.failover_defaults else { return ControlFlow::Continue(()) };
            if record.status != KeyStatus::Active {
                return ControlFlow::Continue(());
            }
            if let Err(e) = defaults.check_kinds(|m| kind(new, m)) {
                broken.push(FieldError::new(
                    format!("key {} ({}): {}", record.id, record.name, e.path),
                    format!(
                        "{} after this change; change the key's defaults first (switchyard keys set-defaults {})",
                        e.message, record.id
                    ),
                ));
                if broken.len() == BROKEN_SHOWN {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        })
        .await?;
        Ok(broken)
    }
}

/// The most keys a refused apply names.
const BROKEN_SHOWN: usize = 10;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use switchyard_proto::admin::v1::admin_server::Admin;

    use super::*;
    use crate::admin::service::testing;

    fn catalog_with_webhook(url: &str) -> String {
        serde_json::json!({
            "webhooks": [{"name": "oncall", "url": url, "events": ["*"]}]
        })
        .to_string()
    }

    async fn apply(admin: &AdminService, json: String) -> Result<pb::ApplyCatalogResponse, Status> {
        let request = pb::ApplyCatalogRequest { catalog_json: json, ..Default::default() };
        admin.apply_catalog(Request::new(request)).await.map(Response::into_inner)
    }

    async fn read(admin: &AdminService) -> String {
        let reply = admin.get_catalog(Request::new(pb::GetCatalogRequest {})).await.unwrap();
        reply.into_inner().catalog_json
    }

    #[tokio::test]
    async fn listings_redact_webhook_url_credentials_and_keep_them_stored() {
        let dir = tempfile::tempdir().unwrap();
        let admin = testing::service(dir.path()).await;
        let url = "https://alice:s3cret@hooks.example.com/x";
        assert!(apply(&admin, catalog_with_webhook(url)).await.unwrap().applied);

        let shown = read(&admin).await;
        assert!(!shown.contains("s3cret") && !shown.contains("alice"), "{shown}");
        assert!(shown.contains("https://***@hooks.example.com/x"), "{shown}");

        // What was read, applied again (as `webhooks enable` and friends do), changes
        // nothing: the stored URL keeps its credentials.
        let again = apply(&admin, shown).await.unwrap();
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        let (stored, _) = admin.load_catalog().await.unwrap();
        assert_eq!(stored.webhooks[0].url, url);
    }

    #[tokio::test]
    async fn apply_refuses_private_webhook_targets_in_every_form() {
        let dir = tempfile::tempdir().unwrap();
        let admin = testing::service(dir.path()).await;
        for url in [
            "http://x@127.0.0.1:9000/hook",
            "http://2130706433:9000/",
            "http://0x7f000001:9000/",
            "http://127.1:9000/",
            "http://[::ffff:127.0.0.1]:9000/",
            "http://[::7f00:1]:9000/",
            "http://[64:ff9b::7f00:1]:9000/",
            "http://198.18.0.1/",
            "http://224.0.0.1/",
        ] {
            let status = apply(&admin, catalog_with_webhook(url)).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{url}");
            assert!(
                status.message().starts_with("webhooks[0].url:"),
                "{url}: {}",
                status.message()
            );
        }
        let upper = apply(&admin, catalog_with_webhook("HTTP://hooks.example.com/x")).await;
        assert!(upper.is_ok_and(|r| r.applied), "an upper-case scheme is http");
    }
}
