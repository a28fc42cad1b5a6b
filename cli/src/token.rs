//! The admin and join tokens: where they come from and how long they must be.

/// The environment variable holding the admin token.
pub const ADMIN_TOKEN_ENV: &str = "SWITCHYARD_ADMIN_TOKEN";

/// The environment variable holding the node join token.
pub const JOIN_TOKEN_ENV: &str = "SWITCHYARD_JOIN_TOKEN";

/// The shortest token accepted. Both tokens are bearer secrets checked on a network port, so
/// anyone who can reach the port can try values: a one-character token falls to a few dozen
/// attempts. Sixteen random characters (the hex of 64 random bits and up) put guessing out of
/// reach; a generated token (`openssl rand -hex 32`) is far longer.
pub const MIN_TOKEN_CHARS: usize = 16;

/// A secret taken from a flag or the environment (an API key for `switchyard drill`): its
/// `Debug` never shows it, so a logged or printed argument list cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// `place` names where the token came from (a variable or a file), never its value.
    #[error(
        "the token in {place} is too short: {chars} character(s), at least {MIN_TOKEN_CHARS} are \
         required so that it cannot be guessed by trying values (generate one with \
         `openssl rand -hex 32`)"
    )]
    TooShort { place: String, chars: usize },
}

/// Refuses a token shorter than [`MIN_TOKEN_CHARS`]; `source` says where it was read.
pub fn check(token: &str, source: &str) -> Result<(), TokenError> {
    let chars = token.chars().count();
    if chars < MIN_TOKEN_CHARS {
        return Err(TokenError::TooShort { place: source.to_owned(), chars });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_token_is_refused_naming_its_source_and_the_minimum() {
        let err = check("x", ADMIN_TOKEN_ENV).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("SWITCHYARD_ADMIN_TOKEN is too short: 1 character(s)"), "{text}");
        assert!(text.contains("at least 16"), "{text}");
        assert!(!text.contains("\"x\""), "the token itself is never echoed: {text}");
        assert!(check(&"a".repeat(15), JOIN_TOKEN_ENV).is_err());
        assert!(check(&"a".repeat(16), JOIN_TOKEN_ENV).is_ok());
    }
}
