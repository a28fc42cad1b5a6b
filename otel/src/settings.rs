//! What the standard `OTEL_*` variables ask for, read and checked once at start-up: an
//! endpoint that does not parse, an unknown protocol, a malformed header list or a timeout
//! that is not a number stops the process, naming the variable, instead of a server that
//! runs and silently exports nothing.

use std::time::Duration;

pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const LOGS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
const TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// The specification's default export timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// One boundary: the environment as the process found it. No variant carries a header's
/// value: headers hold credentials, and this error is printed.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("{var}: {value:?} is not a URL ({why}); expected one like http://collector:4318")]
    Endpoint { var: &'static str, value: String, why: String },
    #[error("{var}: {value:?} is not supported; set grpc or http/protobuf (the default)")]
    Protocol { var: &'static str, value: String },
    #[error("{var}: {value:?} is not a whole number{unit} of at least 1")]
    Number { var: &'static str, value: String, unit: &'static str },
    #[error("{var}: entry {entry} of the list {why}; expected key=value pairs separated by commas")]
    Headers { var: &'static str, entry: usize, why: &'static str },
    #[error(
        "{var}: {value:?} is https, and OTLP over gRPC is exported in plaintext only; use OTLP/HTTP (unset the protocol or set http/protobuf) for an https collector"
    )]
    GrpcTls { var: &'static str, value: String },
    #[error("the OTLP {signal} exporter cannot be built: {why}")]
    Exporter { signal: &'static str, why: String },
}

/// How batches travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`). `http/json` is not
/// offered: every collector that takes it takes `http/protobuf` too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    /// The specification's default.
    HttpProtobuf,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }

    /// The port the specification gives this protocol's default endpoint: a collector
    /// listens for OTLP/gRPC on 4317 and OTLP/HTTP on 4318.
    pub fn default_port(self) -> u16 {
        match self {
            Protocol::Grpc => 4317,
            Protocol::HttpProtobuf => 4318,
        }
    }
}

/// Where and how one signal is exported, with the signal's own variables
/// (`OTEL_EXPORTER_OTLP_TRACES_*`, `OTEL_EXPORTER_OTLP_LOGS_*`) over the generic ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub protocol: Protocol,
    /// The variable the protocol came from, `None` for the default.
    pub protocol_var: Option<&'static str>,
    /// The URL batches go to: a signal's own endpoint as it is; the generic one as it is
    /// for gRPC, and with `v1/traces` or `v1/logs` appended for OTLP/HTTP (the
    /// specification's rule).
    pub endpoint: String,
    /// The endpoint's port, with the scheme's default when the URL names none.
    pub port: Option<u16>,
    /// The names of the headers sent with every batch, for the start-up line; the exporter
    /// reads the values from the same variable itself.
    pub header_names: Vec<String>,
    pub timeout: Duration,
}

impl Export {
    /// The endpoint as the log may show it: without a user name or password, should the URL
    /// carry one.
    pub fn endpoint_shown(&self) -> String {
        match url::Url::parse(&self.endpoint) {
            Ok(url) => shown(&url),
            Err(_) => String::new(),
        }
    }

    /// The other protocol, when the endpoint is on the port the specification gives it
    /// (gRPC on 4317 with `http/protobuf`, or the reverse): most likely a collector spoken
    /// to in the wrong protocol, such as a deployment written when gRPC was the default.
    pub fn port_suggests_other_protocol(&self) -> Option<Protocol> {
        [Protocol::Grpc, Protocol::HttpProtobuf]
            .into_iter()
            .find(|p| *p != self.protocol && Some(p.default_port()) == self.port)
    }
}

/// How one signal's records wait for export: the standard `OTEL_BSP_*` (spans) and
/// `OTEL_BLRP_*` (log records) variables, with the specification's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    pub delay: Duration,
    pub max_queue: usize,
    pub max_batch: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where spans go: `OTEL_EXPORTER_OTLP_ENDPOINT` or its `_TRACES_` form set.
    pub traces: Option<Export>,
    /// Where log records go: `OTEL_EXPORTER_OTLP_ENDPOINT` or its `_LOGS_` form set.
    pub logs: Option<Export>,
    /// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
    pub default_service_name: Option<&'static str>,
    pub span_batches: Batching,
    pub log_batches: Batching,
}

/// The variables of one signal, and the path OTLP/HTTP appends to the generic endpoint.
struct Signal {
    endpoint: &'static str,
    protocol: &'static str,
    headers: &'static str,
    timeout: &'static str,
    path: &'static str,
}

const TRACES: Signal = Signal {
    endpoint: TRACES_ENDPOINT,
    protocol: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    headers: "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    timeout: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    path: "v1/traces",
};

const LOGS: Signal = Signal {
    endpoint: LOGS_ENDPOINT,
    protocol: "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
    headers: "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    timeout: "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT",
    path: "v1/logs",
};

impl Settings {
    /// `None` when OpenTelemetry is off: no OTLP endpoint set, or `OTEL_SDK_DISABLED=true`.
    /// Compression (`OTEL_EXPORTER_OTLP_COMPRESSION`) is left to the exporter.
    pub fn from_env(
        default_service_name: &'static str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, OtelError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var(SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let generic = match var(ENDPOINT) {
            Some(value) => Some(check_endpoint(ENDPOINT, &value)?),
            None => None,
        };
        let traces = export(&TRACES, generic.as_ref(), &var)?;
        let logs = export(&LOGS, generic.as_ref(), &var)?;
        if traces.is_none() && logs.is_none() {
            return Ok(None);
        }
        let named = var(SERVICE_NAME).is_some()
            || var(RESOURCE_ATTRIBUTES)
                .is_some_and(|a| a.split(',').any(|kv| kv.trim().starts_with("service.name=")));
        let batching = |prefix: &'static [&'static str; 3], delay_ms: u64| {
            let [delay, queue, batch] = *prefix;
            let max_queue = number(&var, queue, 2048, "")? as usize;
            Ok::<_, OtelError>(Batching {
                delay: Duration::from_millis(number(&var, delay, delay_ms, " of milliseconds")?),
                max_queue,
                // A batch larger than the queue could never fill (the specification's rule).
                max_batch: (number(&var, batch, 512, "")? as usize).min(max_queue),
            })
        };
        Ok(Some(Settings {
            traces,
            logs,
            default_service_name: (!named).then_some(default_service_name),
            span_batches: batching(
                &[
                    "OTEL_BSP_SCHEDULE_DELAY",
                    "OTEL_BSP_MAX_QUEUE_SIZE",
                    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                ],
                5000,
            )?,
            log_batches: batching(
                &[
                    "OTEL_BLRP_SCHEDULE_DELAY",
                    "OTEL_BLRP_MAX_QUEUE_SIZE",
                    "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
                ],
                1000,
            )?,
        }))
    }
}

/// A positive whole number from `name`, or `default` when it is unset.
fn number(
    var: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: u64,
    unit: &'static str,
) -> Result<u64, OtelError> {
    match var(name) {
        None => Ok(default),
        Some(value) => match value.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(OtelError::Number { var: name, value, unit }),
        },
    }
}

/// One signal's export, `None` when neither its own endpoint nor the generic one is set.
fn export(
    signal: &Signal,
    generic: Option<&url::Url>,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Export>, OtelError> {
    let own = match var(signal.endpoint) {
        Some(value) => Some(check_endpoint(signal.endpoint, &value)?),
        None => None,
    };
    if own.is_none() && generic.is_none() {
        return Ok(None);
    }
    // The signal's own variable wins over the generic one, for every setting.
    let either = |own: &'static str, generic: &'static str| {
        var(own).map(|v| (own, v)).or_else(|| var(generic).map(|v| (generic, v)))
    };
    let (protocol, protocol_var) = match either(signal.protocol, PROTOCOL) {
        None => (Protocol::HttpProtobuf, None),
        Some((name, value)) => match value.trim() {
            "grpc" => (Protocol::Grpc, Some(name)),
            "http/protobuf" => (Protocol::HttpProtobuf, Some(name)),
            _ => return Err(OtelError::Protocol { var: name, value }),
        },
    };
    let (url, url_var) = match (own, generic) {
        (Some(own), _) => (own, signal.endpoint),
        (None, Some(generic)) if protocol == Protocol::HttpProtobuf => {
            (http_signal_url(generic, signal.path), ENDPOINT)
        }
        (None, Some(generic)) => (generic.clone(), ENDPOINT),
        (None, None) => return Ok(None),
    };
    // The gRPC exporter is built without TLS (tonic's TLS would be a second root store and
    // TLS setup beside switchyard-tls's); refused here, naming the variable, rather than by
    // the exporter in words about cargo features.
    if protocol == Protocol::Grpc && url.scheme() == "https" {
        return Err(OtelError::GrpcTls { var: url_var, value: shown(&url) });
    }
    let header_names = match either(signal.headers, HEADERS) {
        None => Vec::new(),
        Some((name, value)) => headers(name, &value)?,
    };
    let timeout = match either(signal.timeout, TIMEOUT) {
        None => DEFAULT_TIMEOUT,
        Some((name, _)) => Duration::from_millis(number(var, name, 0, " of milliseconds")?),
    };
    Ok(Some(Export {
        protocol,
        protocol_var,
        port: url.port_or_known_default(),
        endpoint: url.to_string(),
        header_names,
        timeout,
    }))
}

/// `url` without its user name and password: credentials never reach the log.
fn shown(url: &url::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_password(None);
    let _ = url.set_username("");
    url.to_string()
}

/// The generic endpoint with the signal's path appended to whatever path it has
/// (`http://c:4318` → `http://c:4318/v1/traces`, `http://c/otlp/` → `http://c/otlp/v1/traces`).
fn http_signal_url(generic: &url::Url, path: &str) -> url::Url {
    let mut url = generic.clone();
    let base = generic.path().trim_end_matches('/');
    url.set_path(&format!("{base}/{path}"));
    url
}

/// An OTLP endpoint: an `http` or `https` URL with a host, read by a real URL parser.
fn check_endpoint(var: &'static str, value: &str) -> Result<url::Url, OtelError> {
    let refuse = |why: String| OtelError::Endpoint { var, value: value.to_owned(), why };
    let url = url::Url::parse(value.trim()).map_err(|e| refuse(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse(format!("the scheme must be http or https, not {:?}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("it has no host".into()));
    }
    Ok(url)
}

/// The names of a `key=value,key2=value2` list (the W3C Baggage format the specification
/// names, values percent-encoded), each checked to make a valid HTTP header. What is wrong
/// is said by entry number, never with the value: headers carry credentials.
fn headers(var: &'static str, list: &str) -> Result<Vec<String>, OtelError> {
    let mut names = Vec::new();
    for (i, entry) in list.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let refuse = |why| OtelError::Headers { var, entry: i + 1, why };
        let (key, value) = entry.split_once('=').ok_or_else(|| refuse("has no '='"))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(refuse("has no key"));
        }
        if http::HeaderName::from_bytes(key.as_bytes()).is_err() {
            return Err(refuse("has a key that is not an HTTP header name"));
        }
        let value = percent_decode(value.trim()).ok_or_else(|| {
            refuse("has a value with a '%' that is not followed by two hex digits, or that decodes to no UTF-8")
        })?;
        if value.is_empty() {
            return Err(refuse("has an empty value"));
        }
        if http::HeaderValue::from_str(&value).is_err() {
            return Err(refuse("has a value that is not allowed in an HTTP header"));
        }
        names.push(key.to_ascii_lowercase());
    }
    Ok(names)
}

/// `%XX` escapes decoded; `None` for a broken escape or bytes that are not UTF-8.
fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let mut byte = [0u8];
            hex::decode_to_slice(bytes.get(i + 1..i + 3)?, &mut byte).ok()?;
            out.extend(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, OtelError> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_env("switchyard-node", |k| vars.get(k).cloned())
    }

    #[test]
    fn off_without_an_endpoint_or_when_the_sdk_is_disabled() {
        assert_eq!(settings(&[]).unwrap(), None);
        assert_eq!(settings(&[(ENDPOINT, " ")]).unwrap(), None);
        let disabled = [(ENDPOINT, "http://c:4317"), (SDK_DISABLED, "true")];
        assert_eq!(settings(&disabled).unwrap(), None);
    }

    #[test]
    fn on_with_any_endpoint_and_the_specifications_batching_defaults() {
        let on = settings(&[(TRACES_ENDPOINT, "http://collector:4318")]).unwrap().unwrap();
        assert!(on.traces.is_some() && on.logs.is_none(), "only the signal whose endpoint is set");
        assert_eq!(on.default_service_name, Some("switchyard-node"));
        assert_eq!(on.span_batches.delay, Duration::from_secs(5));
        assert_eq!((on.span_batches.max_queue, on.span_batches.max_batch), (2048, 512));
        assert_eq!(on.log_batches.delay, Duration::from_secs(1));
        let named = settings(&[
            (ENDPOINT, "https://collector"),
            (RESOURCE_ATTRIBUTES, "a=b, service.name=gw"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
        ])
        .unwrap()
        .unwrap();
        assert!(named.traces.is_some() && named.logs.is_some());
        assert_eq!(named.default_service_name, None);
        assert_eq!((named.span_batches.max_queue, named.span_batches.max_batch), (100, 100));
    }

    fn exports(vars: &[(&str, &str)]) -> (Option<Export>, Option<Export>) {
        let on = settings(vars).unwrap().unwrap();
        (on.traces, on.logs)
    }

    #[test]
    fn http_protobuf_is_the_default_and_appends_the_signal_path_to_the_generic_endpoint_only() {
        let (traces, logs) = exports(&[(ENDPOINT, "http://c:4318")]);
        let (traces, logs) = (traces.unwrap(), logs.unwrap());
        assert_eq!((traces.protocol, traces.protocol_var), (Protocol::HttpProtobuf, None));
        assert_eq!(traces.endpoint, "http://c:4318/v1/traces");
        assert_eq!(logs.endpoint, "http://c:4318/v1/logs");
        assert_eq!(traces.port, Some(4318));
        assert_eq!(traces.timeout, Duration::from_secs(10));
        // A path of the collector's own is kept, with or without its trailing slash.
        for base in ["https://gw.example/otlp", "https://gw.example/otlp/"] {
            let (traces, _) = exports(&[(ENDPOINT, base)]);
            let traces = traces.unwrap();
            assert_eq!(traces.endpoint, "https://gw.example/otlp/v1/traces");
            assert_eq!(traces.port, Some(443));
        }
        // A signal's own endpoint is used as it is.
        let (traces, logs) =
            exports(&[(ENDPOINT, "http://c:4318"), (LOGS_ENDPOINT, "http://l:9999/custom")]);
        assert_eq!(traces.unwrap().endpoint, "http://c:4318/v1/traces");
        assert_eq!(logs.unwrap().endpoint, "http://l:9999/custom");
    }

    #[test]
    fn grpc_uses_the_generic_endpoint_as_it_is_and_a_signals_own_variables_win() {
        let (traces, logs) = exports(&[
            (ENDPOINT, "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf"),
            (LOGS_ENDPOINT, "http://l:4318/v1/logs"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "700"),
        ]);
        let (traces, logs) = (traces.unwrap(), logs.unwrap());
        assert_eq!(traces.protocol, Protocol::Grpc);
        assert_eq!(traces.protocol_var, Some("OTEL_EXPORTER_OTLP_PROTOCOL"));
        assert_eq!(traces.endpoint, "http://c:4317/");
        assert_eq!(traces.timeout, Duration::from_millis(2500));
        assert_eq!(logs.protocol, Protocol::HttpProtobuf);
        assert_eq!(logs.protocol_var, Some("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"));
        assert_eq!(logs.endpoint, "http://l:4318/v1/logs");
        assert_eq!(logs.timeout, Duration::from_millis(700));
    }

    #[test]
    fn headers_are_percent_decoded_and_a_signals_own_list_replaces_the_generic_one() {
        let (traces, logs) = exports(&[
            (ENDPOINT, "http://c:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Basic%20dXNlcjpwYXNz, x-tenant = a%2Cb ,",
            ),
            ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-logs=1"),
        ]);
        assert_eq!(traces.unwrap().header_names, ["authorization", "x-tenant"]);
        assert_eq!(logs.unwrap().header_names, ["x-logs"]);
        assert_eq!(percent_decode("a%2Cb%3d%25").as_deref(), Some("a,b=%"));
    }

    #[test]
    fn the_endpoint_shown_has_no_credentials() {
        let (traces, _) = exports(&[(ENDPOINT, "https://user:secret@c/otlp")]);
        assert_eq!(traces.unwrap().endpoint_shown(), "https://c/otlp/v1/traces");
        let grpc = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
        let err = settings(&[(ENDPOINT, "https://user:secret@c"), grpc]).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn an_endpoint_on_the_other_protocols_port_is_noticed() {
        let other = |vars: &[(&str, &str)]| {
            exports(vars).0.and_then(|traces| traces.port_suggests_other_protocol())
        };
        assert_eq!(other(&[(ENDPOINT, "http://c:4317")]), Some(Protocol::Grpc));
        let grpc = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
        assert_eq!(other(&[(ENDPOINT, "http://c:4318"), grpc]), Some(Protocol::HttpProtobuf));
        assert_eq!(other(&[(ENDPOINT, "http://c:4317"), grpc]), None);
        assert_eq!(other(&[(ENDPOINT, "http://c:4318")]), None);
        assert_eq!(other(&[(ENDPOINT, "https://collector.example")]), None);
    }

    #[test]
    fn an_endpoint_that_does_not_parse_is_refused_naming_its_variable() {
        for bad in ["not a url", "localhost:4317", "ftp://c:4317", "http://"] {
            let err = settings(&[(ENDPOINT, bad)]).unwrap_err().to_string();
            assert!(err.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: "), "{bad}: {err}");
        }
        let err = settings(&[(ENDPOINT, "http://c:4317"), (LOGS_ENDPOINT, "::")]).unwrap_err();
        assert!(err.to_string().starts_with(LOGS_ENDPOINT), "{err}");
    }

    #[test]
    fn an_https_endpoint_over_grpc_is_refused_naming_the_endpoints_variable() {
        let grpc = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
        let err = settings(&[(ENDPOINT, "https://c:4317"), grpc]).unwrap_err();
        assert!(err.to_string().starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: "), "{err}");
        let logs = [(ENDPOINT, "http://c:4317"), grpc, (LOGS_ENDPOINT, "https://l:4317")];
        let err = settings(&logs).unwrap_err();
        assert!(err.to_string().starts_with(LOGS_ENDPOINT), "{err}");
        assert!(settings(&[(ENDPOINT, "https://c:4318")]).is_ok(), "https over OTLP/HTTP");
    }

    #[test]
    fn an_unknown_protocol_is_refused_naming_its_variable() {
        for (var, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "GRPC"),
        ] {
            let err = settings(&[(ENDPOINT, "http://c:4318"), (var, value)]).unwrap_err();
            assert!(matches!(err, OtelError::Protocol { .. }), "{err}");
            assert!(err.to_string().starts_with(&format!("{var}: ")), "{err}");
        }
    }

    #[test]
    fn a_malformed_header_list_is_refused_naming_its_variable_and_never_its_values() {
        for (list, entry) in [
            ("a=1,novalue", 2),
            ("=secret", 1),
            ("bad key=secret", 1),
            ("a=secret%2", 1),
            ("a=secret%zz", 1),
            ("a=secret%+1", 1),
            ("a=", 1),
            ("a=secret%0A", 1),
        ] {
            for var in ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"] {
                let err = settings(&[(ENDPOINT, "http://c:4318"), (var, list)]).unwrap_err();
                let said = err.to_string();
                assert!(said.starts_with(&format!("{var}: entry {entry} ")), "{list}: {said}");
                assert!(!said.contains("secret"), "{list}: {said}");
            }
        }
    }

    #[test]
    fn a_bad_number_is_refused_naming_its_variable() {
        for (var, value) in [
            ("OTEL_BLRP_SCHEDULE_DELAY", "1s"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "0"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "-5"),
        ] {
            let err = settings(&[(ENDPOINT, "http://c:4318"), (var, value)]).unwrap_err();
            assert!(err.to_string().starts_with(&format!("{var}: ")), "{err}");
        }
    }
}
