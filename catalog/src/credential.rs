//! References to secrets. Switchyard stores where a secret is, never the secret: the process
//! that uses it (a node for provider keys, the control plane for webhook secrets) resolves
//! the reference from its own environment or files.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, PartialEq, Eq, Hash)]
pub enum CredentialRef {
    /// `env:NAME`
    Env(String),
    /// `file:PATH`
    File(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    // The offending text is never echoed: a pasted secret must not reach logs or terminals.
    #[error(
        "must be a reference `env:NAME` or `file:PATH`; Switchyard never stores a secret itself"
    )]
    NotAReference,
    #[error("`env:` needs a variable name of letters, digits and `_`")]
    BadEnvName,
    #[error("`file:` needs a path")]
    EmptyPath,
    #[error("environment variable {0} is not set")]
    EnvMissing(String),
    #[error("cannot read secret file {path}: {reason}")]
    FileUnreadable { path: String, reason: String },
    #[error("secret file {0} is empty")]
    FileEmpty(String),
}

impl CredentialRef {
    pub fn parse(text: &str) -> Result<Self, CredentialError> {
        if let Some(name) = text.strip_prefix("env:") {
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if valid { Ok(Self::Env(name.to_owned())) } else { Err(CredentialError::BadEnvName) }
        } else if let Some(path) = text.strip_prefix("file:") {
            if path.is_empty() {
                Err(CredentialError::EmptyPath)
            } else {
                Ok(Self::File(path.to_owned()))
            }
        } else {
            Err(CredentialError::NotAReference)
        }
    }

    /// Reads the secret. Blocking (a file read): call it when config is applied, not per request.
    pub fn resolve(&self) -> Result<String, CredentialError> {
        match self {
            Self::Env(name) => match std::env::var(name) {
                Ok(value) if !value.is_empty() => Ok(value),
                _ => Err(CredentialError::EnvMissing(name.clone())),
            },
            Self::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    CredentialError::FileUnreadable { path: path.clone(), reason: e.to_string() }
                })?;
                let secret = text.trim();
                if secret.is_empty() {
                    Err(CredentialError::FileEmpty(path.clone()))
                } else {
                    Ok(secret.to_owned())
                }
            }
        }
    }
}

impl fmt::Display for CredentialRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env(name) => write!(f, "env:{name}"),
            Self::File(path) => write!(f, "file:{path}"),
        }
    }
}

impl fmt::Debug for CredentialRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for CredentialRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CredentialRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_env_and_file_references() {
        assert_eq!(
            CredentialRef::parse("env:OPENAI_API_KEY"),
            Ok(CredentialRef::Env("OPENAI_API_KEY".into()))
        );
        assert_eq!(
            CredentialRef::parse("file:/run/secrets/k"),
            Ok(CredentialRef::File("/run/secrets/k".into()))
        );
    }

    #[test]
    fn refuses_a_literal_secret_without_echoing_it() {
        let err = CredentialRef::parse("sk-live-abcdef").unwrap_err();
        assert_eq!(err, CredentialError::NotAReference);
        assert!(!err.to_string().contains("sk-live"));
    }

    #[test]
    fn refuses_bad_env_names() {
        assert_eq!(CredentialRef::parse("env:"), Err(CredentialError::BadEnvName));
        assert_eq!(CredentialRef::parse("env:A-B"), Err(CredentialError::BadEnvName));
        assert_eq!(CredentialRef::parse("file:"), Err(CredentialError::EmptyPath));
    }
}
