//! One webhook request: the HTTP client, the SSRF guard, and how a response is classified.
//!
//! SSRF: the catalog refuses private IP literals and `localhost` at apply time unless the
//! subscription is `internal`. At delivery both are checked again on the URL as the `url`
//! crate parses it, and the request goes to that parsed URL (credentials removed), so the
//! host checked is the host connected to whatever form the text gave it (`x@127.0.0.1`,
//! `0x7f000001`, `[::ffff:127.0.0.1]`). Names are checked by the connector's own resolver,
//! which drops every non-public address a name resolves to, so the addresses checked are
//! the addresses connected to (a name re-pointed at a private address between a check and
//! the connect, DNS rebinding, gains nothing).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;

use switchyard_catalog::address::{self, is_private_ip};
use switchyard_time::now_ms;
use switchyard_tls::words;

use super::signing::sign;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Receivers' answers are read (so connections are reused) up to this size.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// A Retry-After beyond this is taken as this: an hour-long pause is the dead-letter age's
/// business, not the endpoint's.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

pub type WebhookClient =
    Client<hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// Resolves names and, unless `internal`, drops private and loopback addresses.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    internal: bool,
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let internal = self.internal;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if internal {
                return Ok(resolved.into_iter());
            }
            let public: Vec<SocketAddr> =
                resolved.into_iter().filter(|a| !is_private_ip(a.ip())).collect();
            if public.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "{host} resolves only to private or loopback addresses; \
                         set `internal: true` on the subscription to allow them"
                    ),
                ));
            }
            Ok(public.into_iter())
        })
    }
}

/// A pooled client for one subscription (its own pool, so one endpoint's connections
/// never queue behind another's).
pub fn build(internal: bool) -> WebhookClient {
    let mut http = HttpConnector::new_with_resolver(GuardedResolver { internal });
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(switchyard_tls::connect::public_web(http))
}

/// How one delivery attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// 2xx.
    Delivered { status: u16 },
    /// Timeout, connection error, 408, 429 or 5xx: try again later.
    Retry { status: u16, error: String, retry_after: Option<Duration> },
    /// Any other answer: the receiver refused this event; retrying would not change that.
    Refused { status: u16, error: String },
}

pub struct Request<'a> {
    pub url: &'a str,
    pub internal: bool,
    pub id: &'a str,
    /// `None`: the subscription has no secret; the request goes unsigned.
    pub signing_key: Option<&'a [u8]>,
    pub body: Bytes,
    pub timeout: Duration,
}

pub async fn send(client: &WebhookClient, req: Request<'_>) -> Outcome {
    let uri = match target(req.url, req.internal) {
        Ok(uri) => uri,
        Err(error) => return Outcome::Retry { status: 0, error, retry_after: None },
    };
    let timestamp = now_ms().div_euclid(1000);
    let mut builder = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("switchyard-webhooks/", env!("CARGO_PKG_VERSION")),
        )
        .header("webhook-id", req.id)
        .header("webhook-timestamp", timestamp.to_string());
    if let Some(key) = req.signing_key {
        builder = builder.header("webhook-signature", sign(key, req.id, timestamp, &req.body));
    }
    let request = match builder.body(Full::new(req.body)) {
        Ok(r) => r,
        Err(e) => return Outcome::Refused { status: 0, error: format!("invalid request: {e}") },
    };
    let exchange = async {
        let response = client.request(request).await.map_err(|e| words::chain(&e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        // The body is read only so the connection can be reused; its content is ignored.
        let _ = Limited::new(response.into_body(), MAX_RESPONSE_BYTES).collect().await;
        Ok::<_, String>((status, retry_after))
    };
    match tokio::time::timeout(req.timeout, exchange).await {
        Err(_) => Outcome::Retry {
            status: 0,
            error: format!("no answer within {} ms", req.timeout.as_millis()),
            retry_after: None,
        },
        Ok(Err(error)) => Outcome::Retry { status: 0, error, retry_after: None },
        Ok(Ok((status, retry_after))) => classify(status, retry_after),
    }
}

fn classify(status: u16, retry_after: Option<Duration>) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered { status },
        408 | 429 | 500..=599 => {
            Outcome::Retry { status, error: format!("HTTP {status}"), retry_after }
        }
        _ => Outcome::Refused { status, error: format!("HTTP {status}") },
    }
}

/// Delay-seconds or an HTTP-date, capped at [`MAX_RETRY_AFTER`].
fn parse_retry_after(text: &str) -> Option<Duration> {
    switchyard_time::retry_after(text, std::time::SystemTime::now()).map(|d| d.min(MAX_RETRY_AFTER))
}

/// The URI a delivery goes to: the subscription's URL as the `url` crate parses it, with any
/// user name and password removed (hyper would not send them, and they must not reach a
/// log line). Unless `internal`, a host that is not public is refused here: the connector
/// skips the resolver for IP literals, so the resolver's check never sees them. Public for
/// the fuzz target of the webhook URL check (docs/fuzzing.md).
pub fn target(url: &str, internal: bool) -> Result<http::Uri, String> {
    let mut parsed = address::check_webhook_url(url, internal)
        .map_err(|e| format!("{}: {e}", address::redact_userinfo(url)))?;
    // Both succeed on an http(s) URL with a host, which `check_webhook_url` ensured.
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    http::Uri::try_from(parsed.as_str()).map_err(|e| format!("invalid URL: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_answers_are_5xx_429_and_408() {
        assert!(matches!(classify(503, None), Outcome::Retry { .. }));
        assert!(
            matches!(classify(429, Some(Duration::from_secs(3))), Outcome::Retry { retry_after: Some(d), .. } if d == Duration::from_secs(3))
        );
        assert!(matches!(classify(408, None), Outcome::Retry { .. }));
        assert!(matches!(classify(400, None), Outcome::Refused { .. }));
        assert!(matches!(classify(410, None), Outcome::Refused { .. }));
        assert_eq!(classify(204, None), Outcome::Delivered { status: 204 });
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_capped() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        let soon = httpdate_in(Duration::from_secs(120));
        let wait = parse_retry_after(&soon).unwrap_or_default();
        assert!(
            wait > Duration::from_secs(110) && wait <= Duration::from_secs(120),
            "{soon}: {wait:?}"
        );
        assert_eq!(parse_retry_after("soon"), None);
    }

    fn httpdate_in(d: Duration) -> String {
        httpdate::fmt_http_date(std::time::SystemTime::now() + d)
    }

    #[tokio::test]
    async fn names_resolving_to_private_addresses_are_refused_unless_internal() {
        use tower_service::Service as _;
        let name: Name = "localhost".parse().unwrap_or_else(|_| unreachable!());
        let err = GuardedResolver { internal: false }.call(name.clone()).await.err();
        assert_eq!(err.map(|e| e.kind()), Some(std::io::ErrorKind::PermissionDenied));
        let ok = GuardedResolver { internal: true }.call(name).await;
        assert!(ok.is_ok_and(|mut addrs| addrs.all(|a| a.ip().is_loopback())));
    }

    /// Every form of a non-public target (the same table the catalog's apply-time test
    /// uses), refused at delivery before any connection is made.
    const PRIVATE_TARGETS: &[&str] = &[
        "http://127.0.0.1:9000/hook",
        "http://x@127.0.0.1:9000/hook",
        "http://user:pw@127.0.0.1:9000/hook",
        "http://hooks.example.com@127.0.0.1:9000/hook",
        "http://2130706433:9000/",
        "http://0x7f000001:9000/",
        "http://0177.0.0.1:9000/",
        "http://0177.1:9000/",
        "http://127.1:9000/",
        "HTTP://127.0.0.1:9000/hook",
        "http://localhost:9000/",
        "http://[::1]:9000/",
        "http://[::]:9000/",
        "http://0.0.0.0:9000/",
        "http://[::ffff:127.0.0.1]:9000/",
        "http://[::7f00:1]:9000/",
        "http://[64:ff9b::7f00:1]:9000/",
        "http://[fc00::1]/",
        "http://[fd12:3456::1]/",
        "http://[fe80::1]/",
        "http://[ff02::1]/",
        "http://10.1.2.3/",
        "http://172.16.0.1/",
        "http://192.168.1.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://198.18.0.1/",
        "http://224.0.0.1/",
        "http://255.255.255.255/",
        "http://192.0.2.1/",
        "http://198.51.100.1/",
        "http://203.0.113.1/",
    ];

    #[test]
    fn every_form_of_a_private_target_is_refused_at_delivery_unless_internal() {
        for url in PRIVATE_TARGETS {
            let refused = target(url, false);
            assert!(
                refused.as_ref().is_err_and(|e| e.contains("internal: true")),
                "{url}: {refused:?}"
            );
            assert!(!refused.unwrap_err().contains("pw@"), "credentials stay out of errors");
            assert!(target(url, true).is_ok(), "{url} is allowed when internal");
        }
    }

    #[test]
    fn the_request_goes_to_the_parsed_host_without_credentials() {
        for (url, uri) in [
            ("http://x@127.0.0.1:9000/hook", "http://127.0.0.1:9000/hook"),
            ("http://0x7f000001:9000/a?b=1", "http://127.0.0.1:9000/a?b=1"),
            ("http://2130706433:9000/", "http://127.0.0.1:9000/"),
            ("HTTP://user:pw@Hooks.Example.com/x", "http://hooks.example.com/x"),
        ] {
            assert_eq!(target(url, true).map(|u| u.to_string()), Ok(uri.to_owned()), "{url}");
        }
        assert_eq!(
            target("https://u:p@hooks.example.com/x", false).map(|u| u.to_string()),
            Ok("https://hooks.example.com/x".to_owned())
        );
        assert!(target("ftp://hooks.example.com/x", false).is_err());
    }

    /// A receiver on loopback that answers 204 to every request and reports each request
    /// head it read.
    async fn receiver() -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                    let _ = conn.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
                });
            }
        });
        (port, rx)
    }

    #[tokio::test]
    async fn a_disguised_loopback_target_is_never_connected_to_unless_internal() {
        let (port, mut requests) = receiver().await;
        let forms = [
            format!("http://x@127.0.0.1:{port}/hook"),
            format!("http://user:pw@127.0.0.1:{port}/hook"),
            format!("http://2130706433:{port}/hook"),
            format!("http://0x7f000001:{port}/hook"),
            format!("http://0177.0.0.1:{port}/hook"),
            format!("http://127.1:{port}/hook"),
            format!("HTTP://127.0.0.1:{port}/hook"),
        ];
        fn request(url: &str, internal: bool) -> Request<'_> {
            Request {
                url,
                internal,
                id: "msg_1",
                signing_key: None,
                body: Bytes::from_static(b"{}"),
                timeout: Duration::from_secs(5),
            }
        }
        let guarded = build(false);
        let open = build(true);
        for url in &forms {
            let outcome = send(&guarded, request(url, false)).await;
            assert!(
                matches!(&outcome, Outcome::Retry { status: 0, error, .. } if error.contains("internal: true")),
                "{url}: {outcome:?}"
            );
            // The refusal comes before any connection: nothing reached the receiver. (A
            // request sent would be read before `send` returned its answer.)
            assert!(requests.try_recv().is_err(), "{url} reached the receiver");

            assert_eq!(send(&open, request(url, true)).await, Outcome::Delivered { status: 204 });
            let head = requests.recv().await.unwrap();
            assert!(head.starts_with("POST /hook HTTP/1.1"), "{url}: {head}");
            assert!(!head.contains("pw") && !head.contains("x@"), "no credentials sent: {head}");
        }
    }
}
