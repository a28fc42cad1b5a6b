//! Reading helpers shared by the formats: a field that is a string or a list, and reading a
//! body with the path of a bad field kept.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::Refusal;

/// A field that is a string or a list of `T` (Messages' `content` and `system`, Chat's
/// `content` and `stop`). Read with a visitor rather than `#[serde(untagged)]`, so an error
/// inside the list keeps its path (`content[1].type`) instead of "did not match any variant".
#[derive(Debug, Clone)]
pub(crate) enum OneOrList<T> {
    One(String),
    List(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = OneOrList<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(OneOrList::One(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(OneOrList::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(OneOrList::List(items))
            }
        }
        deserializer.deserialize_any(V(PhantomData))
    }
}

/// A field that is a string or an object `T` (Chat's `tool_choice`), read with a visitor so
/// that an error inside the object keeps its path.
#[derive(Debug, Clone)]
pub(crate) enum OneOrObject<T> {
    One(String),
    Object(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrObject<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = OneOrObject<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an object")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(OneOrObject::One(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(OneOrObject::One(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(OneOrObject::Object)
            }
        }
        deserializer.deserialize_any(V(PhantomData))
    }
}

/// Reads a JSON body into `T`, refusing with the path of the first bad field.
pub(crate) fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(Refusal::from_serde)?;
    de.end().map_err(|e| Refusal::at("body", format!("the body is not valid JSON ({e})")))?;
    Ok(value)
}

/// JSON text as a `RawValue`, or `{}` when it is not a JSON object (a model's truncated
/// arguments): formats that want an object get one.
pub(crate) fn object(text: &str) -> Box<serde_json::value::RawValue> {
    match serde_json::from_str::<Box<serde_json::value::RawValue>>(text) {
        Ok(raw) if raw.get().trim_start().starts_with('{') => raw,
        _ => empty_object(),
    }
}

/// Raw JSON as its text, without copying it.
pub(crate) fn text(raw: Box<serde_json::value::RawValue>) -> String {
    Box::<str>::from(raw).into()
}

/// The schema of a function without parameters.
pub(crate) fn empty_object_schema() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(r#"{"type":"object","properties":{}}"#.to_owned())
        .unwrap_or_else(|_| empty_object())
}

pub(crate) fn empty_object() -> Box<serde_json::value::RawValue> {
    // `{}` is valid JSON: the fallback never runs, and keeps this free of panics.
    serde_json::value::RawValue::from_string("{}".to_owned())
        .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned())
}

/// A value as JSON bytes. Serialising the crate's own structs (strings, numbers, raw JSON
/// that was read as valid) cannot fail; were it ever to, an empty object is written
/// rather than a panic.
pub(crate) fn to_vec<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())
}
