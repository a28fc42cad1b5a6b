//! The CLI's one error type, and how it reaches the terminal: `error: ...` lines on stderr,
//! exit 2 for usage mistakes (as clap does), 1 for everything else.

use tonic::Code;

use crate::drill::error::DrillError;
use crate::serve::ServeError;
use crate::token::{ADMIN_TOKEN_ENV, TokenError};
use switchyard_catalog::file::CatalogFileError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    CatalogFile(#[from] CatalogFileError),
    #[error("{0}")]
    Usage(String),
    #[error("no admin token: set {ADMIN_TOKEN_ENV} or pass --admin-token-file")]
    NoToken,
    #[error("cannot read admin token file {path}: {source}")]
    TokenFile { path: String, source: std::io::Error },
    #[error("admin token file {0} is empty")]
    TokenFileEmpty(String),
    #[error(transparent)]
    Token(#[from] TokenError),
    // The token itself is never echoed.
    #[error("the admin token holds characters a gRPC header cannot carry")]
    TokenInvalid,
    #[error("invalid control-plane URL {url:?}: {reason}")]
    BadControlUrl { url: String, reason: String },
    /// A TLS file or setting of the CLI's own (it names the flag and file).
    #[error("{0}")]
    Tls(String),
    #[error("no control plane answers at {urls}")]
    Unreachable { urls: String, failures: Vec<String> },
    /// A status from the control plane; `message` is the server's own words.
    #[error("{message}")]
    Status { code: Code, message: String, hint: Option<String> },
    #[error("unexpected reply from the control plane: {0}")]
    BadResponse(String),
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot encode YAML: {0}")]
    Yaml(serde_yaml_ng::Error),
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
    #[error(transparent)]
    Drill(#[from] DrillError),
}

impl CliError {
    pub fn from_status(status: tonic::Status, url: &str) -> Self {
        let code = status.code();
        let mut message = status.message().trim().to_owned();
        if message.is_empty() {
            message = code.description().to_owned();
        }
        // A connection that failed under the call (a TLS refusal after the handshake, with
        // TLS 1.3) says why only in the status's causes.
        if let Some(cause) = std::error::Error::source(&status) {
            let cause = switchyard_tls::words::chain(cause);
            if cause.starts_with(&message) {
                message = cause;
            } else if !message.contains(&cause) {
                message = format!("{message}: {cause}");
            }
        }
        let tls_refusal = message.contains("TLS handshake");
        let hint = match code {
            Code::Unauthenticated | Code::PermissionDenied => Some(format!(
                "the control plane refused the admin token: set {ADMIN_TOKEN_ENV} (or \
                 --admin-token-file) to the token it was started with"
            )),
            Code::Unavailable if tls_refusal => None,
            Code::Unavailable => Some(format!(
                "the control plane at {url} is unavailable; is it running and is its store up?"
            )),
            Code::DeadlineExceeded => {
                Some(format!("the control plane at {url} did not answer in time"))
            }
            _ => None,
        };
        Self::Status { code, message, hint }
    }

    /// An `events --follow` stream that ended with an error once it was open: said as the
    /// stream's end, with how to follow again. A control plane that shuts down ends it so
    /// (`Unavailable`, in its own words); a connection that broke under it (the control
    /// plane killed, a proxy timing out) shows as the transport's error, said as such.
    pub fn follow_ended(status: tonic::Status, url: &str) -> Self {
        let broke = std::error::Error::source(&status).is_some();
        match Self::from_status(status, url) {
            Self::Status { code, message, .. }
                if !matches!(code, Code::Unauthenticated | Code::PermissionDenied) =>
            {
                let why = if broke { format!("the connection broke ({message})") } else { message };
                Self::Status {
                    code,
                    message: format!("the event stream from {url} ended: {why}"),
                    hint: Some(
                        "follow again (`switchyard events --follow`) once it is back, or on \
                         another replica: --control takes a comma-separated list"
                            .to_owned(),
                    ),
                }
            }
            other => other,
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Drill(e) => e.exit_code(),
            _ => 1,
        }
    }

    /// The lines printed on stderr.
    pub fn report(&self) -> Vec<String> {
        match self {
            Self::CatalogFile(e) => {
                let mut lines: Vec<String> =
                    e.lines().iter().map(|l| format!("error: {l}")).collect();
                if let CatalogFileError::Invalid { file, errors } = e {
                    let n = errors.0.len();
                    let s = if n == 1 { "" } else { "s" };
                    lines.push(format!("{file}: {n} error{s}; nothing was sent"));
                }
                lines
            }
            Self::Unreachable { failures, .. } => {
                let mut lines = vec![format!("error: {self}")];
                lines.extend(failures.iter().map(|f| format!("  {f}")));
                if failures.iter().all(|f| f.contains("TLS handshake")) {
                    lines.push(
                        "hint: it answers, but TLS failed: see docs/operating.md, \"TLS\" \
                         (--control-ca, the certificate's host names, its dates)"
                            .to_owned(),
                    );
                } else {
                    lines.push(
                        "hint: start one (`switchyard control` or `switchyard dev`) or point \
                         --control / SWITCHYARD_CONTROL at it"
                            .to_owned(),
                    );
                }
                lines
            }
            Self::Status { hint, .. } => {
                let mut lines = vec![format!("error: {self}")];
                lines.extend(hint.iter().map(|h| format!("hint: {h}")));
                lines
            }
            other => vec![format!("error: {other}")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_are_printed_as_sent() {
        let status =
            tonic::Status::invalid_argument(r#"failoverDefaults.models[1]: unknown model "x""#);
        let e = CliError::from_status(status, "http://127.0.0.1:7400");
        assert_eq!(e.report(), [r#"error: failoverDefaults.models[1]: unknown model "x""#]);
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn unauthenticated_hints_at_the_token_variable() {
        let e = CliError::from_status(tonic::Status::unauthenticated("bad token"), "http://x");
        let lines = e.report();
        assert_eq!(lines[0], "error: bad token");
        assert!(lines[1].starts_with("hint: ") && lines[1].contains("SWITCHYARD_ADMIN_TOKEN"));
    }

    #[test]
    fn unavailable_hints_at_the_url() {
        let e = CliError::from_status(tonic::Status::unavailable("store down"), "http://h:1");
        assert_eq!(e.report()[0], "error: store down");
        assert!(e.report()[1].contains("http://h:1"));
    }

    #[test]
    fn a_follow_ended_by_a_stopping_control_plane_says_so_and_how_to_follow_again() {
        let status = tonic::Status::unavailable("this control plane is shutting down");
        let e = CliError::follow_ended(status, "http://h:1");
        assert_eq!(
            e.report(),
            [
                "error: the event stream from http://h:1 ended: this control plane is shutting down",
                "hint: follow again (`switchyard events --follow`) once it is back, or on another \
                 replica: --control takes a comma-separated list",
            ]
        );
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn a_follow_cut_under_its_stream_says_the_connection_broke() {
        let cause = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let mut status = tonic::Status::unknown("h2 protocol error: error reading a body");
        status.set_source(std::sync::Arc::new(cause));
        let lines = CliError::follow_ended(status, "http://h:1").report();
        assert!(
            lines[0].starts_with("error: the event stream from http://h:1 ended: the connection broke (h2 protocol error"),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("hint: follow again"), "{lines:?}");
    }

    #[test]
    fn unreachable_lists_each_url_and_hints_at_the_flag() {
        let e = CliError::Unreachable {
            urls: "http://a:1, http://b:1".into(),
            failures: vec!["http://a:1: refused".into(), "http://b:1: refused".into()],
        };
        let lines = e.report();
        assert_eq!(lines[0], "error: no control plane answers at http://a:1, http://b:1");
        assert_eq!(lines[1], "  http://a:1: refused");
        assert!(lines[3].contains("SWITCHYARD_CONTROL"));
    }

    #[test]
    fn a_missing_token_names_the_variable() {
        assert!(CliError::NoToken.to_string().contains("SWITCHYARD_ADMIN_TOKEN"));
    }
}
