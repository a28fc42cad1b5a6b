//! Query strings and percent-encoded path segments (model names carry slashes).

/// The decoded value of `name` in a query string.
pub fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(key) == name).then(|| percent_decode(value))
    })
}

/// `%2F` → `/` and `+` → space: model names carry slashes and get encoded by some clients.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let mut byte = [0u8];
                match hex::decode_to_slice(&bytes[i + 1..i + 3], &mut byte) {
                    Ok(()) => {
                        out.extend(byte);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_and_paths() {
        assert_eq!(
            query_param("a=1&model=openai%2Fgpt-4o", "model").as_deref(),
            Some("openai/gpt-4o")
        );
        assert_eq!(percent_decode("x%2"), "x%2");
        assert_eq!(percent_decode("a%zz"), "a%zz");
    }
}
