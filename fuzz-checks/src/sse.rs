//! The upstream SSE parser ([`Parser`]).
//!
//! Invariants: the same bytes in any chunking yield the same events (and the same error, at
//! the same event); and, for UTF-8 input, the events are the ones the WHATWG
//! event-stream algorithm dispatches (lines end at CRLF, LF or CR; a blank line ends an
//! event; an event without `data` is not dispatched). The algorithm below is that
//! specification written plainly, as the oracle; it leaves out what the gateway does not
//! use (`id`, `retry`, the byte-order mark).

use switchyard_data_plane::providers::sse::{Frame, Parser, SseError};

/// Input layout: the first byte seeds the chunk sizes, the rest is the stream.
pub fn check(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else { return };
    let whole = parse(stream, &[stream.len().max(1)]);
    let sizes = chunk_sizes(seed);
    let chunked = parse(stream, &sizes);
    assert_eq!(whole, chunked, "the same bytes in chunks of {sizes:?} gave other events");
    let bytewise = parse(stream, &[1]);
    assert_eq!(whole, bytewise, "the same bytes one at a time gave other events");
    if let Ok(text) = std::str::from_utf8(stream) {
        let expected = reference(text);
        let got: Vec<(Option<String>, String)> = whole
            .events
            .iter()
            .map(|f| (f.event.clone().filter(|e| !e.is_empty()), f.data.clone()))
            .collect();
        assert_eq!(got, expected, "the events differ from the event-stream algorithm's");
        assert_eq!(whole.error, None, "UTF-8 input of this size is never refused");
    }
}

/// What a parser made of a stream: its events, the error that stopped it, and whether
/// bytes of an unfinished event were left.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    events: Vec<Frame>,
    error: Option<SseError>,
    partial: bool,
}

/// Chunk sizes 1..=8 drawn from `seed`, cycled over the stream.
fn chunk_sizes(seed: u8) -> Vec<usize> {
    let mut x = u32::from(seed) | 0x100;
    (0..8)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            ((x >> 16) % 8 + 1) as usize
        })
        .collect()
}

fn parse(stream: &[u8], sizes: &[usize]) -> Outcome {
    let mut parser = Parser::default();
    let mut events = Vec::new();
    let mut rest = stream;
    let mut size = sizes.iter().cycle();
    while !rest.is_empty() {
        let n = size.next().copied().unwrap_or(1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if let Err(e) = parser.push(chunk) {
            return Outcome { events, error: Some(e), partial: true };
        }
        loop {
            match parser.next_frame() {
                Ok(Some(frame)) => events.push(frame),
                Ok(None) => break,
                Err(e) => return Outcome { events, error: Some(e), partial: true },
            }
        }
    }
    Outcome { events, error: None, partial: parser.has_partial() }
}

/// The WHATWG event-stream interpretation of a whole stream: (event type, data) per
/// dispatched event, an empty type as `None`.
pub fn reference(text: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    let mut event = String::new();
    let mut data = String::new();
    let mut rest = text;
    // Only complete lines count: an unterminated last line is an unfinished event.
    while let Some(end) = rest.find(['\r', '\n']) {
        let line = &rest[..end];
        let skip = if rest[end..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[end + skip..];
        if line.is_empty() {
            if !data.is_empty() {
                data.pop();
                let name = std::mem::take(&mut event);
                out.push(((!name.is_empty()).then_some(name), std::mem::take(&mut data)));
            }
            event.clear();
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut event),
            "data" => {
                data.push_str(value);
                data.push('\n');
            }
            _ => {}
        }
    }
    out
}
