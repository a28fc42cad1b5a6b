//! What the standard `OTEL_*` variables ask for, read and checked once at start-up: an
//! endpoint that does not parse stops the process, naming the variable, instead of a server
//! that runs and silently exports nothing.

use std::time::Duration;

pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const LOGS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT";
const PROTOCOLS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
];
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// One boundary: the environment as the process found it.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("{var}: {value:?} is not a URL ({why}); expected one like http://collector:4317")]
    Endpoint { var: &'static str, value: String, why: String },
    #[error(
        "{var}: {value:?} is not supported; Switchyard exports OTLP over gRPC: unset it or set grpc"
    )]
    Protocol { var: &'static str, value: String },
    #[error("{var}: {value:?} is not a whole number{unit} of at least 1")]
    Number { var: &'static str, value: String, unit: &'static str },
    #[error("the OTLP {signal} exporter cannot be built: {why}")]
    Exporter { signal: &'static str, why: String },
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
    /// Whether spans are exported: `OTEL_EXPORTER_OTLP_ENDPOINT` or its `_TRACES_` form set.
    pub traces: bool,
    /// Whether log records are exported: `OTEL_EXPORTER_OTLP_ENDPOINT` or its `_LOGS_` form set.
    pub logs: bool,
    /// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
    pub default_service_name: Option<&'static str>,
    pub span_batches: Batching,
    pub log_batches: Batching,
}

impl Settings {
    /// `None` when OpenTelemetry is off: no OTLP endpoint set, or `OTEL_SDK_DISABLED=true`.
    /// The exporter reads the endpoint, headers, timeout and compression itself; they are
    /// checked here so that a typo is refused before anything listens.
    pub fn from_env(
        default_service_name: &'static str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, OtelError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var(SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let mut set = [false; 3];
        for (i, name) in [ENDPOINT, TRACES_ENDPOINT, LOGS_ENDPOINT].into_iter().enumerate() {
            if let Some(value) = var(name) {
                check_endpoint(name, &value)?;
                set[i] = true;
            }
        }
        let [all, traces, logs] = set;
        if !(all || traces || logs) {
            return Ok(None);
        }
        for name in PROTOCOLS {
            if let Some(value) = var(name)
                && value.trim() != "grpc"
            {
                return Err(OtelError::Protocol { var: name, value });
            }
        }
        let named = var(SERVICE_NAME).is_some()
            || var(RESOURCE_ATTRIBUTES)
                .is_some_and(|a| a.split(',').any(|kv| kv.trim().starts_with("service.name=")));
        let batching = |prefix: &'static [&'static str; 3], delay_ms: u64| {
            let [delay, queue, batch] = *prefix;
            let number = |name: &'static str, default: u64, unit| match var(name) {
                None => Ok(default),
                Some(value) => match value.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(OtelError::Number { var: name, value, unit }),
                },
            };
            let max_queue = number(queue, 2048, "")? as usize;
            Ok::<_, OtelError>(Batching {
                delay: Duration::from_millis(number(delay, delay_ms, " of milliseconds")?),
                max_queue,
                // A batch larger than the queue could never fill (the specification's rule).
                max_batch: (number(batch, 512, "")? as usize).min(max_queue),
            })
        };
        Ok(Some(Settings {
            traces: all || traces,
            logs: all || logs,
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

/// An OTLP/gRPC endpoint: an `http` or `https` URL with a host, read by a real URL parser.
fn check_endpoint(var: &'static str, value: &str) -> Result<(), OtelError> {
    let refuse = |why: String| OtelError::Endpoint { var, value: value.to_owned(), why };
    let url = url::Url::parse(value.trim()).map_err(|e| refuse(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse(format!("the scheme must be http or https, not {:?}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("it has no host".into()));
    }
    Ok(())
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
        let on = settings(&[(TRACES_ENDPOINT, "http://collector:4317")]).unwrap().unwrap();
        assert!(on.traces && !on.logs, "only the signal whose endpoint is set");
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
        assert!(named.traces && named.logs);
        assert_eq!(named.default_service_name, None);
        assert_eq!((named.span_batches.max_queue, named.span_batches.max_batch), (100, 100));
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
    fn another_protocol_or_a_bad_number_is_refused_naming_its_variable() {
        let err = settings(&[
            (ENDPOINT, "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ])
        .unwrap_err();
        assert!(err.to_string().starts_with("OTEL_EXPORTER_OTLP_PROTOCOL: "), "{err}");
        let err = settings(&[(ENDPOINT, "http://c:4317"), ("OTEL_BLRP_SCHEDULE_DELAY", "1s")])
            .unwrap_err();
        assert!(err.to_string().starts_with("OTEL_BLRP_SCHEDULE_DELAY: "), "{err}");
    }
}
