//! Standard Webhooks signatures: the `webhook-signature` header and the ids of batches.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::events::digest_id;

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    // The secret is never echoed.
    #[error("the secret starts with whsec_ but the rest is not base64")]
    BadWhsec,
    #[error("the secret is empty")]
    Empty,
}

/// The HMAC key of a secret: a `whsec_<base64>` secret (the Standard Webhooks form, which
/// the official verifier libraries take) is base64-decoded; any other is used as its bytes.
pub fn signing_key(secret: &str) -> Result<Vec<u8>, SignError> {
    let key = match secret.strip_prefix("whsec_") {
        Some(b64) => {
            // The libraries accept unpadded base64 too.
            let engine = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
            );
            engine.decode(b64.trim()).map_err(|_| SignError::BadWhsec)?
        }
        None => secret.as_bytes().to_vec(),
    };
    if key.is_empty() { Err(SignError::Empty) } else { Ok(key) }
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
pub fn sign(key: &[u8], id: &str, timestamp_secs: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length; the error case cannot happen.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_secs.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

/// The id of a batch delivery, derived from its members so that a batch formed differently
/// (after a leader change) never shares an id with one a receiver already deduplicated.
pub fn batch_id(ids: &[&str]) -> String {
    digest_id("batch", &Sha256::digest(ids.join("\n").as_bytes()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn signs_like_the_standard_webhooks_reference() {
        // The test vector of the Standard Webhooks specification's libraries.
        let key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn whsec_secrets_may_be_unpadded_and_raw_secrets_are_bytes() {
        assert_eq!(signing_key("whsec_YWJj").unwrap(), b"abc");
        assert_eq!(signing_key("whsec_YWI").unwrap(), b"ab");
        assert_eq!(signing_key("plain").unwrap(), b"plain");
        assert!(signing_key("whsec_!!").is_err());
        assert!(signing_key("").is_err());
    }

    #[test]
    fn batch_ids_depend_on_every_member() {
        assert_ne!(batch_id(&["a", "b"]), batch_id(&["a"]));
        assert_eq!(batch_id(&["a", "b"]), batch_id(&["a", "b"]));
    }
}
