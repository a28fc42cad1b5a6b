//! The on-disk format: the names of the directory's files, the records of the log, the
//! snapshot, and how a value is written in either.
//!
//! Kept apart from the code that reads and writes the files because it is a contract across
//! releases: a directory written by one release must open in the next, and in the one before
//! after a rollback. Nothing here may change how an existing record, field or value is
//! written, and every form an earlier release wrote must still be read.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::store::api::{LeaseId, Revision};

pub(super) const LOCK_FILE: &str = "LOCK";
pub(super) const SNAPSHOT_FILE: &str = "snapshot.json";
pub(super) const SNAPSHOT_TMP_FILE: &str = "snapshot.json.tmp";
pub(super) const LOG_FILE: &str = "wal.jsonl";

/// One line of the log.
#[derive(Serialize, Deserialize)]
pub(super) struct LogEntry {
    pub(super) seq: u64,
    pub(super) record: Record,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", try_from = "WireRecord")]
pub(super) enum Record {
    /// One revision: every change of one transaction.
    Commit {
        changes: Vec<Change>,
    },
    Grant {
        id: LeaseId,
        ttl_ms: u64,
    },
    /// Removes the lease and deletes its keys at a new revision.
    Revoke {
        id: LeaseId,
    },
    Compact {
        revision: Revision,
    },
}

impl Change {
    pub(super) fn key(&self) -> &str {
        match self {
            Change::Put { key, .. } | Change::Delete { key } => key,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum Change {
    Put {
        key: String,
        #[serde(with = "value_encoding")]
        value: Bytes,
        lease: LeaseId,
    },
    Delete {
        key: String,
    },
}

/// A record as read back. serde reads an internally tagged enum by buffering it first, and a
/// buffered value can no longer be taken verbatim, as a `{"json": ...}` value must be: so a
/// record is read into plain structs, whose fields serde_json hands over as they are parsed,
/// and converted into a [`Record`] after.
#[derive(Deserialize)]
struct WireRecord {
    op: String,
    #[serde(default)]
    changes: Vec<WireChange>,
    id: Option<LeaseId>,
    ttl_ms: Option<u64>,
    revision: Option<Revision>,
}

#[derive(Deserialize)]
struct WireChange {
    kind: String,
    key: String,
    #[serde(default, deserialize_with = "value_encoding::deserialize_some")]
    value: Option<Bytes>,
    #[serde(default)]
    lease: LeaseId,
}

fn missing(field: &str, op: &str) -> String {
    format!("a {op} record without {field}")
}

impl TryFrom<WireRecord> for Record {
    type Error = String;

    fn try_from(r: WireRecord) -> Result<Self, String> {
        let op = r.op.as_str();
        Ok(match op {
            "commit" => Record::Commit {
                changes: r.changes.into_iter().map(Change::try_from).collect::<Result<_, _>>()?,
            },
            "grant" => Record::Grant {
                id: r.id.ok_or_else(|| missing("id", op))?,
                ttl_ms: r.ttl_ms.ok_or_else(|| missing("ttl_ms", op))?,
            },
            "revoke" => Record::Revoke { id: r.id.ok_or_else(|| missing("id", op))? },
            "compact" => {
                Record::Compact { revision: r.revision.ok_or_else(|| missing("revision", op))? }
            }
            other => return Err(format!("unknown record op {other:?}")),
        })
    }
}

impl TryFrom<WireChange> for Change {
    type Error = String;

    fn try_from(c: WireChange) -> Result<Self, String> {
        match c.kind.as_str() {
            "put" => Ok(Change::Put {
                key: c.key,
                value: c.value.ok_or_else(|| missing("value", "put"))?,
                lease: c.lease,
            }),
            "delete" => Ok(Change::Delete { key: c.key }),
            other => Err(format!("unknown change kind {other:?}")),
        }
    }
}

/// The whole of `snapshot.json`.
#[derive(Serialize, Deserialize)]
pub(super) struct Snapshot {
    pub(super) seq: u64,
    pub(super) revision: Revision,
    pub(super) floor: Revision,
    pub(super) kvs: Vec<StoredKv>,
    pub(super) leases: Vec<StoredLease>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredKv {
    pub(super) key: String,
    #[serde(with = "value_encoding")]
    pub(super) value: Bytes,
    pub(super) create_revision: Revision,
    pub(super) mod_revision: Revision,
    pub(super) version: i64,
    pub(super) lease: LeaseId,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredLease {
    pub(super) id: LeaseId,
    pub(super) ttl_ms: u64,
}

/// Values are arbitrary bytes, but nearly all are JSON documents. A value that is one
/// compact JSON document is written as itself, `{"json": ...}`: checking it is cheaper than
/// escaping it into a string, and in an outage storm the audit log's event documents are
/// most of what the writer thread encodes. Any other UTF-8 value is written as
/// `{"text": "..."}`, anything else as `{"hex": "..."}`. Earlier releases wrote `text` and
/// `hex` values, or a bare hex string, all still read, so their directories open unchanged.
mod value_encoding {
    use bytes::Bytes;
    use serde::de::{self, Deserializer, MapAccess, Visitor};
    use serde::ser::{SerializeMap, Serializer};
    use serde_json::value::RawValue;

    /// `bytes` as a JSON document that re-encodes to exactly the same bytes: no whitespace
    /// around it (the parser would drop it) and no line break in it (the log is one record
    /// per line).
    fn as_document(bytes: &[u8]) -> Option<&RawValue> {
        let raw: &RawValue = serde_json::from_slice(bytes).ok()?;
        (raw.get().len() == bytes.len() && !bytes.contains(&b'\n')).then_some(raw)
    }

    pub fn serialize<S: Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        if let Some(document) = as_document(bytes) {
            map.serialize_entry("json", document)?;
        } else {
            match std::str::from_utf8(bytes) {
                Ok(text) => map.serialize_entry("text", text)?,
                Err(_) => map.serialize_entry("hex", &hex::encode(bytes))?,
            }
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_any(Value)
    }

    pub fn deserialize_some<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        deserialize(d).map(Some)
    }

    struct Value;

    impl<'de> Visitor<'de> for Value {
        type Value = Bytes;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a value: {\"json\": ...}, {\"text\": ...}, {\"hex\": ...} or a hex string")
        }

        /// The earliest releases' form.
        fn visit_str<E: de::Error>(self, hex: &str) -> Result<Bytes, E> {
            from_hex(hex)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bytes, A::Error> {
            let value = match map.next_key::<std::borrow::Cow<'de, str>>()?.as_deref() {
                Some("json") => {
                    let document: Box<RawValue> = map.next_value()?;
                    Bytes::from(String::from(Box::<str>::from(document)))
                }
                Some("text") => Bytes::from(map.next_value::<String>()?),
                Some("hex") => from_hex(&map.next_value::<std::borrow::Cow<'de, str>>()?)?,
                Some(other) => {
                    return Err(de::Error::unknown_field(other, &["json", "text", "hex"]));
                }
                None => return Err(de::Error::missing_field("json")),
            };
            if map.next_key::<de::IgnoredAny>()?.is_some() {
                return Err(de::Error::custom("a value has exactly one of json, text or hex"));
            }
            Ok(value)
        }
    }

    fn from_hex<E: de::Error>(s: &str) -> Result<Bytes, E> {
        hex::decode(s).map(Bytes::from).map_err(|e| match e {
            hex::FromHexError::OddLength => E::custom("odd-length hex value"),
            _ => E::custom("invalid hex value"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::embedded::EmbeddedStore;

    #[test]
    fn json_documents_are_written_as_themselves_other_text_as_text_and_bytes_as_hex() {
        let line = |value: &[u8]| {
            let entry = LogEntry {
                seq: 1,
                record: Record::Commit {
                    changes: vec![Change::Put {
                        key: "k".into(),
                        value: Bytes::copy_from_slice(value),
                        lease: 0,
                    }],
                },
            };
            serde_json::to_string(&entry).unwrap()
        };
        let cases: [(&[u8], &str); 5] = [
            (br#"{"a":"b\n","n":[1,2]}"#, r#""value":{"json":{"a":"b\n","n":[1,2]}}"#),
            // Whitespace around a document would be lost, a line break inside would split
            // the record: both stay text, byte for byte.
            (b" {\"a\":1}", r#""value":{"text":" {\"a\":1}"}"#),
            (b"{\n\"a\": 1\n}", r#""value":{"text":"{\n\"a\": 1\n}"}"#),
            (b"plain text", r#""value":{"text":"plain text"}"#),
            (&[0xff, 0x00], r#""value":{"hex":"ff00"}"#),
        ];
        for (value, expected) in cases {
            let line = line(value);
            assert!(line.contains(expected), "{line}");
            assert!(!line.contains('\n'), "{line}");
            let back: LogEntry = serde_json::from_str(&line).unwrap();
            let Record::Commit { changes } = &back.record else { panic!("{line}") };
            let [Change::Put { value: read, .. }] = changes.as_slice() else { panic!("{line}") };
            assert_eq!(&read[..], value, "{line}");
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
        }
    }

    /// A directory written before values were stored as text (every value a bare hex
    /// string, in the snapshot and in the log) still opens with every value intact.
    #[tokio::test]
    async fn a_directory_written_with_hex_values_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(SNAPSHOT_FILE),
            format!(
                r#"{{"seq":1,"revision":2,"floor":0,"kvs":[{{"key":"a","value":"{}","create_revision":2,"mod_revision":2,"version":1,"lease":0}}],"leases":[]}}"#,
                hex::encode(r#"{"x":1}"#)
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(LOG_FILE),
            format!(
                "{}\n",
                format_args!(
                    r#"{{"seq":2,"record":{{"op":"commit","changes":[{{"kind":"put","key":"b","value":"{}","lease":0}}]}}}}"#,
                    hex::encode("plain text")
                )
            ),
        )
        .unwrap();
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(&store.get("a").await.unwrap().unwrap().value[..], br#"{"x":1}"#);
        assert_eq!(&store.get("b").await.unwrap().unwrap().value[..], b"plain text");
        // New writes go on in the new form and the mixed log replays.
        store.put("c", vec![0xfe], None).await.unwrap();
        store.close().await;
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(&store.get("b").await.unwrap().unwrap().value[..], b"plain text");
        assert_eq!(&store.get("c").await.unwrap().unwrap().value[..], [0xfe]);
    }
}
