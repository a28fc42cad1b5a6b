//! API keys as a node holds them: only what serving needs, small enough that a million fit
//! in a few hundred MiB (docs/BENCHMARKS.md, "A million keys").
//!
//! The control plane's record (`ApiKeyRecord`) also carries a name, times and a hint for
//! people; a node needs none of them. What it needs is the digest it looks the secret up by
//! (32 bytes, not 64 hex characters), the status, and the key's settings — defaults, allowed
//! models and regions, limits — which most fleets share between many keys: keys parsed
//! together (a snapshot, a last-known-good file) share one copy of equal settings.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use switchyard_catalog::keys::{digest_hex, parse_digest};
use switchyard_catalog::{FailoverDefaults, KeyStatus, Limits};

/// One API key on a node.
#[derive(Debug, PartialEq)]
pub struct Key {
    pub id: Box<str>,
    /// SHA-256 of the secret.
    pub digest: [u8; 32],
    pub status: KeyStatus,
    pub settings: Arc<KeySettings>,
}

/// What a key decides about the requests made with it.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeySettings {
    #[serde(default, rename = "failoverDefaults", skip_serializing_if = "Option::is_none")]
    pub failover_defaults: Option<FailoverDefaults>,
    /// Empty: every model in the catalog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_models: Vec<String>,
    /// Empty: every region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_regions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

impl Key {
    pub fn is_active(&self) -> bool {
        self.status == KeyStatus::Active
    }

    /// An active key with at least one limit: the node counts it for the fleet.
    pub fn limited(&self) -> bool {
        self.is_active() && self.settings.limits.is_some_and(|l| !l.is_empty())
    }

    /// The key as the node's last-known-good file keeps it: the record's fields the node
    /// uses, under the record's names, so [`KeyParser::parse`] reads either.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        #[derive(Serialize)]
        struct Stored<'a> {
            id: &'a str,
            status: KeyStatus,
            secret_sha256: String,
            #[serde(flatten)]
            settings: &'a KeySettings,
        }
        serde_json::to_vec(&Stored {
            id: &self.id,
            status: self.status,
            secret_sha256: digest_hex(&self.digest),
            settings: &self.settings,
        })
    }
}

/// The fields of a stored key record a node reads; the others (name, times, hint) are
/// skipped unparsed. Settings are kept as raw JSON first, so that equal settings are parsed
/// once and shared.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    status: KeyStatus,
    #[serde(borrow)]
    secret_sha256: Cow<'a, str>,
    #[serde(default, borrow, rename = "failoverDefaults")]
    failover_defaults: Option<&'a RawValue>,
    #[serde(default, borrow)]
    allowed_models: Option<&'a RawValue>,
    #[serde(default, borrow)]
    allowed_regions: Option<&'a RawValue>,
    #[serde(default, borrow)]
    limits: Option<&'a RawValue>,
}

/// Parses key records, sharing one [`KeySettings`] between keys whose settings are written
/// the same. Lives for one batch of keys (a snapshot, a file): the table is dropped with it.
#[derive(Default)]
pub struct KeyParser {
    shared: HashMap<Box<[u8]>, Arc<KeySettings>>,
    scratch: Vec<u8>,
}

impl KeyParser {
    /// Distinct settings the table keeps; past this many (every key its own) it stops
    /// growing, and each further key's settings are parsed for it alone.
    const MAX_SHARED: usize = 4096;

    /// A key from its stored JSON (the control plane's record, or [`Key::to_json`]).
    pub fn parse(&mut self, value: &[u8]) -> Result<Key, String> {
        let wire: Wire<'_> = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        let digest = parse_digest(&wire.secret_sha256)
            .ok_or("secret_sha256 is not a SHA-256 in hex (64 hex digits)")?;
        let raw = [wire.failover_defaults, wire.allowed_models, wire.allowed_regions, wire.limits];
        self.scratch.clear();
        for field in raw {
            // Length-prefixed, so that no two different field lists give the same bytes.
            let text = field.map_or("", RawValue::get).as_bytes();
            self.scratch.extend_from_slice(&text.len().to_le_bytes());
            self.scratch.extend_from_slice(text);
        }
        let settings = match self.shared.get(self.scratch.as_slice()) {
            Some(settings) => Arc::clone(settings),
            None => {
                let settings = Arc::new(settings_of(raw)?);
                if self.shared.len() < Self::MAX_SHARED {
                    self.shared.insert(self.scratch.as_slice().into(), Arc::clone(&settings));
                }
                settings
            }
        };
        Ok(Key { id: wire.id.into(), digest, status: wire.status, settings })
    }
}

fn settings_of(
    [defaults, models, regions, limits]: [Option<&RawValue>; 4],
) -> Result<KeySettings, String> {
    fn field<T: serde::de::DeserializeOwned + Default>(
        name: &str,
        raw: Option<&RawValue>,
    ) -> Result<T, String> {
        raw.map_or(Ok(T::default()), |raw| {
            serde_json::from_str(raw.get()).map_err(|e| format!("{name}: {e}"))
        })
    }
    Ok(KeySettings {
        failover_defaults: field("failoverDefaults", defaults)?,
        allowed_models: field("allowed_models", models)?,
        allowed_regions: field("allowed_regions", regions)?,
        limits: field("limits", limits)?,
    })
}

/// A key record as the control plane stores it, for the secret `secret`, with `extra`
/// fields added or replaced: for the node's tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub fn record(id: &str, secret: &str, extra: serde_json::Value) -> Vec<u8> {
    use switchyard_catalog::keys::hash_secret;
    let mut record = serde_json::json!({
        "id": id, "name": "tenant", "created_unix_ms": 1, "updated_unix_ms": 2,
        "status": "active", "secret_sha256": hash_secret(secret), "secret_hint": "abcd"
    });
    if let (Some(r), Some(e)) = (record.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    serde_json::to_vec(&record).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use switchyard_catalog::keys::secret_digest;

    #[test]
    fn a_record_becomes_a_key_with_its_digest_and_settings() {
        let mut parser = KeyParser::default();
        let key = parser
            .parse(&record(
                "k1",
                "sy-secret",
                json!({"failoverDefaults": {"models": ["a", "b"], "timeout_ms": 900},
                       "allowed_models": ["a", "b"], "limits": {"rpm": 5}}),
            ))
            .unwrap();
        assert_eq!(&*key.id, "k1");
        assert_eq!(key.digest, secret_digest("sy-secret"));
        assert!(key.is_active() && key.limited());
        let defaults = key.settings.failover_defaults.as_ref().unwrap();
        assert_eq!(
            (defaults.models.as_slice(), defaults.timeout_ms),
            (&["a".into(), "b".into()][..], Some(900))
        );
        assert_eq!(key.settings.allowed_models, ["a", "b"]);
        assert!(key.settings.allowed_regions.is_empty());
    }

    #[test]
    fn keys_with_the_same_settings_share_one_copy_and_different_ones_do_not() {
        let mut parser = KeyParser::default();
        let defaults = json!({"failoverDefaults": {"models": ["a", "b"]}});
        let a = parser.parse(&record("a", "s1", defaults.clone())).unwrap();
        let b = parser.parse(&record("b", "s2", defaults)).unwrap();
        let c = parser
            .parse(&record("c", "s3", json!({"failoverDefaults": {"models": ["b"]}})))
            .unwrap();
        // The same list moved to another field is other settings, not the same bytes.
        let d = parser.parse(&record("d", "s4", json!({"allowed_models": ["a", "b"]}))).unwrap();
        assert!(Arc::ptr_eq(&a.settings, &b.settings));
        assert!(!Arc::ptr_eq(&a.settings, &c.settings));
        assert_ne!(a.settings, d.settings);
    }

    #[test]
    fn the_stored_form_parses_back_to_the_same_key() {
        let mut parser = KeyParser::default();
        let key = parser
            .parse(&record(
                "k1",
                "sy-x",
                json!({"status": "revoked", "allowed_regions": ["eu"], "limits": {"usd_per_day": 2.5}}),
            ))
            .unwrap();
        let again = KeyParser::default().parse(&key.to_json().unwrap()).unwrap();
        assert_eq!(again, key);
        assert!(!again.is_active());
    }

    #[test]
    fn a_record_without_a_usable_digest_or_settings_is_refused_naming_the_field() {
        let mut parser = KeyParser::default();
        let mut bad_hash: serde_json::Value =
            serde_json::from_slice(&record("k", "s", json!({}))).unwrap();
        bad_hash["secret_sha256"] = json!("h");
        let e = parser.parse(&serde_json::to_vec(&bad_hash).unwrap()).unwrap_err();
        assert!(e.contains("secret_sha256"), "{e}");
        let e = parser.parse(&record("k", "s", json!({"limits": {"rpm": "many"}}))).unwrap_err();
        assert!(e.starts_with("limits:"), "{e}");
        assert!(parser.parse(b"{\"id\":\"k\"}").is_err());
    }
}
