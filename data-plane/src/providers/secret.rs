//! Provider secrets, kept out of logs and debug output.

use std::fmt;
use std::sync::Arc;

/// A provider secret. Never printed: `Debug` and `Display` show only that it is there.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn new(secret: &str) -> Self {
        Self(secret.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}
