//! What the listener shares between connections: scripts, accepted keys, counters, the last
//! request per model, and the ids the simulated providers hand out.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use hyper::header::HeaderMap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::behaviour::Behaviour;

/// `GET /_sim/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub models: BTreeMap<String, ModelStats>,
    pub connections: ConnectionStats,
    /// Provider requests of any model (chat completions and model lists).
    pub requests: u64,
    /// Anthropic `count_tokens` requests (not in `requests`).
    #[serde(default)]
    pub token_counts: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStats {
    pub requests: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionStats {
    pub opened: u64,
    pub closed: u64,
    pub open: u64,
}

/// A request as the simulator received it, for tests that check what the gateway forwarded.
///
/// Kept as received (cheap reference-counted clones of hyper's buffers) and turned into
/// strings or JSON only when asked: the benchmark should not pay for inspection.
#[derive(Debug, Clone)]
pub struct LastRequest {
    uri: hyper::Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl LastRequest {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// A header's value (names are case-insensitive); repeated headers joined with ", ".
    pub fn header(&self, name: &str) -> Option<String> {
        let mut values = self.headers.get_all(name).iter();
        let first = String::from_utf8_lossy(values.next()?.as_bytes()).into_owned();
        Some(values.fold(first, |mut joined, v| {
            joined.push_str(", ");
            joined.push_str(&String::from_utf8_lossy(v.as_bytes()));
            joined
        }))
    }

    /// All headers: lower-case names, repeated headers joined with ", ".
    pub fn headers(&self) -> BTreeMap<String, String> {
        self.headers
            .keys()
            .filter_map(|name| Some((name.as_str().to_owned(), self.header(name.as_str())?)))
            .collect()
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body as JSON, or as a JSON string when it is not JSON.
    pub fn body_json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

// === Shared state ===

pub struct State {
    pub models: Mutex<HashMap<String, ModelState>>,
    /// Accepted keys; empty accepts any request.
    pub keys: Mutex<Vec<String>>,
    connections: Mutex<ConnectionStats>,
    /// Provider requests of any model.
    pub requests: AtomicU64,
    /// `count_tokens` requests, which are not completions.
    pub token_counts: AtomicU64,
    next_id: AtomicU64,
    /// Unix seconds at start: the `created` of listed models, and a seed for ids.
    pub started: u64,
}

#[derive(Default)]
pub struct ModelState {
    script: Option<Arc<Behaviour>>,
    /// Requests served under the current script: the index into a sequence.
    position: u64,
    pub requests: u64,
    pub last: Option<LastRequest>,
}

impl State {
    pub fn new() -> Self {
        State {
            models: Mutex::new(HashMap::new()),
            keys: Mutex::new(Vec::new()),
            connections: Mutex::new(ConnectionStats::default()),
            requests: AtomicU64::new(0),
            token_counts: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            started: switchyard_time::now_secs(),
        }
    }

    pub fn set(&self, model: String, behaviour: Behaviour) {
        let mut models = self.models.lock();
        let entry = models.entry(model).or_default();
        entry.script = Some(Arc::new(behaviour));
        entry.position = 0;
    }

    pub fn unset(&self, model: &str) {
        if let Some(entry) = self.models.lock().get_mut(model) {
            entry.script = None;
            entry.position = 0;
        }
    }

    pub fn behaviour(&self, model: &str) -> Behaviour {
        self.models.lock().get(model).and_then(|m| m.script.as_deref().cloned()).unwrap_or_default()
    }

    /// Clears scripts, keys and request counters. Connection counters restart from the
    /// connections open now (`opened = open`, `closed = 0`), so `open` stays true.
    pub fn reset(&self) {
        self.models.lock().clear();
        self.keys.lock().clear();
        self.requests.store(0, Ordering::Relaxed);
        self.token_counts.store(0, Ordering::Relaxed);
        let mut conns = self.connections.lock();
        *conns = ConnectionStats { opened: conns.open, closed: 0, open: conns.open };
    }

    pub fn stats(&self) -> Stats {
        let models = self
            .models
            .lock()
            .iter()
            .filter(|(_, m)| m.requests > 0 || m.script.is_some())
            .map(|(name, m)| (name.clone(), ModelStats { requests: m.requests }))
            .collect();
        Stats {
            models,
            connections: *self.connections.lock(),
            requests: self.requests.load(Ordering::Relaxed),
            token_counts: self.token_counts.load(Ordering::Relaxed),
        }
    }

    pub fn connection_opened(&self) {
        let mut c = self.connections.lock();
        c.opened += 1;
        c.open += 1;
    }

    pub fn connection_closed(&self) {
        let mut c = self.connections.lock();
        c.closed += 1;
        c.open = c.open.saturating_sub(1);
    }

    /// `chatcmpl-` plus 29 base-62 characters, like OpenAI's, unique within this process.
    pub fn completion_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut id = String::with_capacity(38);
        id.push_str("chatcmpl-");
        // 10 base-62 digits use 60 of a u64's 64 bits: three words make the 29 characters.
        push_base62(&mut id, splitmix(n ^ self.started), 10);
        push_base62(&mut id, splitmix(n.wrapping_add(1 << 40)), 10);
        push_base62(&mut id, splitmix(n.wrapping_add(2 << 40)), 9);
        id
    }

    /// One lock: counts and remembers a provider request for `model` and, when `advance`
    /// (key and body were good), takes its next scripted step.
    pub fn take_step(
        &self,
        model: Cow<'_, str>,
        parts: &hyper::http::request::Parts,
        body: &Bytes,
        advance: bool,
    ) -> (Option<Arc<Behaviour>>, u64) {
        let mut models = self.models.lock();
        let entry = match models.get_mut(&*model) {
            Some(entry) => entry,
            None => models.entry(model.into_owned()).or_default(),
        };
        entry.requests += 1;
        entry.last = Some(LastRequest {
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body: body.clone(),
        });
        let script = entry.script.clone();
        let position = entry.position;
        if advance {
            entry.position += 1;
        }
        (script, position)
    }

    pub fn request_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("req_{:016x}{:016x}", splitmix(n), splitmix(n ^ self.started))
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn push_base62(out: &mut String, mut x: u64, len: usize) {
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..len {
        out.push(char::from(ALPHABET[(x % 62) as usize]));
        x /= 62;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_look_like_openai_ids() {
        let state = State::new();
        let (a, b) = (state.completion_id(), state.completion_id());
        assert!(a.starts_with("chatcmpl-") && a.len() == 38 && a != b);
    }
}
