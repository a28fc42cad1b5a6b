//! The request id (docs/http-api.md, "Response headers"): the client's `x-request-id` when it
//! is one a log line, a header and an event can carry safely, else one the node makes. Every
//! response carries it, the provider call sends it upstream and a failover event records it,
//! so one id follows a request from the client's logs to the provider's.

use http::{HeaderMap, HeaderName, HeaderValue};

pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client id taken as is: room for a UUID, a W3C trace id with its span, or a
/// prefixed id of any common scheme, and short enough for every log line and event.
pub const MAX_LEN: usize = 128;

/// The request's id: the client's `x-request-id` when it is valid, else a new one. A header
/// sent more than once is not one id, so it is replaced too.
pub fn of(headers: &HeaderMap) -> HeaderValue {
    let mut sent = headers.get_all(&HEADER).iter();
    match (sent.next(), sent.next()) {
        (Some(id), None) if is_valid(id.as_bytes()) => id.clone(),
        _ => generate(),
    }
}

/// Sets the request's id on `headers` (a missing or refused one replaced by a new one), so
/// every handler reads the same; returns it.
pub fn ensure(headers: &mut HeaderMap) -> HeaderValue {
    let id = of(headers);
    headers.insert(HEADER, id.clone());
    id
}

/// 1 to [`MAX_LEN`] visible ASCII characters: no spaces or control characters that could
/// split a log line or forge a header, nothing a terminal would interpret.
pub fn is_valid(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| b.is_ascii_graphic())
}

/// 32 lowercase hex digits of a random `u128`: one small string per request, unique enough
/// that two requests never share one.
pub fn generate() -> HeaderValue {
    let hex = format!("{:032x}", rand::random::<u128>());
    // Hex digits are always a valid header value; the fallback is never taken.
    HeaderValue::try_from(hex).unwrap_or(HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(HEADER, HeaderValue::from_bytes(v).unwrap());
        }
        map
    }

    #[test]
    fn a_valid_client_id_is_kept() {
        for id in [&b"req-1"[..], b"0f8e2a1c-6b3d-4e5f-9a7b-1c2d3e4f5a6b", &[b'a'; MAX_LEN]] {
            assert_eq!(of(&headers(&[id])).as_bytes(), id);
        }
    }

    #[test]
    fn a_missing_or_refused_id_is_replaced_by_a_new_one() {
        let long = [b'a'; MAX_LEN + 1];
        let refused: [&[&[u8]]; 6] =
            [&[], &[b""], &[b"has space"], &[b"tab\there"], &[&long], &[b"caf\xc3\xa9"]];
        for sent in refused {
            let id = of(&headers(sent));
            assert_eq!(id.len(), 32, "{sent:?}");
            assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit), "{id:?}");
        }
        let twice = of(&headers(&[b"a", b"b"]));
        assert_eq!(twice.len(), 32, "two ids are not one: {twice:?}");
    }

    #[test]
    fn generated_ids_differ() {
        assert_ne!(generate(), generate());
    }

    #[test]
    fn ensure_writes_the_id_every_handler_reads() {
        let mut map = headers(&[b"bad id"]);
        let id = ensure(&mut map);
        assert_eq!(map.get(HEADER), Some(&id));
        assert_eq!(of(&map), id);
    }
}
