//! Reading and writing the catalog file of `switchyard apply -f` (docs/catalog.md). It lives
//! in this crate, not the CLI, so the fuzz target and its replay test call the loader
//! `apply` calls (docs/fuzzing.md).
//!
//! Every error names the file, the YAML path and the field, because the person reading it
//! has to find the line in a file of many similar entries (`models[7]` looks like the rest).

use std::fmt;
use std::path::Path;

use crate::catalog::Catalog;
use crate::error::ValidationErrors;

#[derive(Debug, thiserror::Error)]
pub enum CatalogFileError {
    #[error("{file}: cannot read: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{0}")]
    Parse(ParseError),
    /// Every rule the catalog breaks, so one run fixes them all.
    #[error("{}", render_invalid(.file, .errors))]
    Invalid { file: String, errors: ValidationErrors },
}

/// A document serde could not read: `path` is where in the YAML, `location` the line and
/// column when the YAML parser knows them.
#[derive(Debug)]
pub struct ParseError {
    pub file: String,
    pub path: String,
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        if self.path.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.path, self.message)
        }
    }
}

impl CatalogFileError {
    /// One line per problem, for `error: ` prefixes.
    pub fn lines(&self) -> Vec<String> {
        self.to_string().lines().map(str::to_owned).collect()
    }
}

fn render_invalid(file: &str, errors: &ValidationErrors) -> String {
    errors
        .0
        .iter()
        .map(|e| format!("{file}: {}: {}", e.path, e.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads, parses and validates a catalog file.
pub fn load(path: &Path) -> Result<Catalog, CatalogFileError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|source| CatalogFileError::Read { file: file.clone(), source })?;
    parse(&file, &text)
}

/// Parses and validates catalog text; `file` is only used to name it in errors.
pub fn parse(file: &str, text: &str) -> Result<Catalog, CatalogFileError> {
    let catalog = if text.trim().is_empty() {
        // An empty file is an empty catalog (serde_yaml would call it "EOF"); applying it
        // shows every resource it would remove, so nothing is lost silently.
        Catalog::default()
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de)
            .map_err(|e| CatalogFileError::Parse(parse_error(file, e)))?
    };
    catalog
        .validate()
        .map_err(|errors| CatalogFileError::Invalid { file: file.to_owned(), errors })?;
    Ok(catalog)
}

fn parse_error(file: &str, e: serde_path_to_error::Error<serde_yaml_ng::Error>) -> ParseError {
    let mut path = e.path().to_string();
    if path == "." {
        path.clear();
    }
    let inner = e.into_inner();
    let location = inner.location().map(|l| (l.line(), l.column()));
    let mut message = inner.to_string();
    // serde_yaml's message repeats its own path and position; we print ours once, in front.
    if let Some((line, column)) = location {
        let suffix = format!(" at line {line} column {column}");
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
    }
    // serde_yaml's path can stop at the parent of ours (an unknown field), so strip the
    // longest prefix of our path that it used.
    let mut prefix = path.as_str();
    while !prefix.is_empty() {
        if let Some(stripped) = message.strip_prefix(&format!("{prefix}: ")) {
            message = stripped.to_owned();
            break;
        }
        prefix = &prefix[..prefix.rfind(['.', '[']).unwrap_or(0)];
    }
    // Name the unknown field itself (`models[0].upstream_modle`), should serde report it at
    // its parent.
    if let Some(field) = message.strip_prefix("unknown field `").and_then(|r| r.split('`').next())
        && path.rsplit('.').next() != Some(field)
    {
        path = if path.is_empty() { field.to_owned() } else { format!("{path}.{field}") };
    }
    ParseError { file: file.to_owned(), path, location, message }
}

/// The catalog as YAML, in exactly the form `parse` reads back.
pub fn to_yaml(catalog: &Catalog) -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(catalog)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"
providers:
  - name: openai
    kind: openai
    base_url: https://api.openai.com/v1
    api_keys: ["env:OPENAI_API_KEY"]
models:
  - name: openai/gpt-5-nano
    provider: openai
    upstream_model: gpt-5-nano
"#;

    fn parse_err(text: &str) -> ParseError {
        match parse("catalog.yaml", text) {
            Err(CatalogFileError::Parse(e)) => e,
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_file_parses() {
        let c = parse("catalog.yaml", VALID).unwrap();
        assert_eq!(c.models[0].provider, "openai");
    }

    #[test]
    fn validation_errors_name_file_path_and_field() {
        let text = VALID.replace("provider: openai", "provider: nope");
        let err = parse("catalog.yaml", &text).unwrap_err();
        assert_eq!(
            err.lines(),
            [r#"catalog.yaml: models[0].provider: unknown provider "nope": not in providers"#]
        );
    }

    #[test]
    fn a_bad_weight_or_balance_is_named_by_its_yaml_path() {
        let deployments = |extra: &str| {
            VALID.replace(
                "    provider: openai\n    upstream_model: gpt-5-nano\n",
                &format!("{extra}    deployments:\n      - {{provider: openai, upstream_model: a, weight: -1}}\n"),
            )
        };
        let balance = parse_err(&deployments("    balance: fastest\n"));
        assert_eq!(balance.path, "models[0].balance", "{balance}");
        let weight = parse_err(&deployments(""));
        assert_eq!(weight.path, "models[0].deployments[0].weight", "{weight}");
        assert!(weight.message.contains("must be a positive integer"), "{weight}");
    }

    #[test]
    fn every_validation_error_is_listed() {
        let text = format!("{VALID}breaker_policy:\n  window_size: 0\nwebhooks:\n  - name: w\n    url: ftp://x\n    events: [nope]\n")
            .replace("provider: openai", "provider: nope");
        let lines = parse("c.yaml", &text).unwrap_err().lines();
        assert!(lines.len() >= 4, "{lines:#?}");
        assert!(lines.iter().all(|l| l.starts_with("c.yaml: ")), "{lines:#?}");
        assert!(lines.iter().any(|l| l.starts_with("c.yaml: webhooks[0].events[0]: ")));
    }

    #[test]
    fn retry_policy_out_of_range_is_named_with_file_and_path() {
        let text = format!("{VALID}retry_policy:\n  max_retries: 9\n  budget_ratio: 2\n");
        assert_eq!(
            parse("c.yaml", &text).unwrap_err().lines(),
            [
                "c.yaml: retry_policy.max_retries: must be 0–5, got 9",
                "c.yaml: retry_policy.budget_ratio: must be a number from 0 to 1, got 2",
            ]
        );
        let text = format!("{VALID}retry_policy:\n  on: [server_eror]\n");
        assert_eq!(parse_err(&text).path, "retry_policy.on[0]");
        let text = VALID.replace(
            "upstream_model: gpt-5-nano\n",
            "upstream_model: gpt-5-nano\n    retry: {max_retries: 6}\n",
        );
        assert_eq!(
            parse("c.yaml", &text).unwrap_err().lines(),
            ["c.yaml: models[0].retry.max_retries: must be 0–5, got 6"]
        );
    }

    #[test]
    fn context_window_is_a_positive_integer_named_by_its_path() {
        let with = |value: &str| {
            VALID.replace(
                "upstream_model: gpt-5-nano\n",
                &format!("upstream_model: gpt-5-nano\n    context_window: {value}\n"),
            )
        };
        let c = parse("c.yaml", &with("128000")).unwrap();
        assert_eq!(c.models[0].context_window, Some(128_000));
        assert_eq!(parse("c.yaml", VALID).unwrap().models[0].context_window, None);
        assert_eq!(
            parse("c.yaml", &with("0")).unwrap_err().lines(),
            ["c.yaml: models[0].context_window: must be a positive integer (tokens)"]
        );
        for bad in ["-5", "1.5", "8k", "true"] {
            let e = parse_err(&with(bad));
            assert_eq!(e.path, "models[0].context_window", "{bad}");
            assert!(e.message.contains("must be a positive integer (tokens)"), "{bad}: {e}");
        }
    }

    #[test]
    fn continuation_is_none_or_prefill_named_by_its_path() {
        let with = |value: &str| {
            VALID.replace(
                "upstream_model: gpt-5-nano\n",
                &format!("upstream_model: gpt-5-nano\n    continuation: {value}\n"),
            )
        };
        let c = parse("c.yaml", &with("prefill")).unwrap();
        assert_eq!(c.models[0].continuation, crate::catalog::Continuation::Prefill);
        assert_eq!(parse("c.yaml", VALID).unwrap().models[0].continuation, Default::default());
        for bad in ["maybe", "true", "1"] {
            let e = parse_err(&with(bad));
            assert_eq!(e.path, "models[0].continuation", "{bad}");
            assert!(e.message.contains("none") && e.message.contains("prefill"), "{bad}: {e}");
        }
    }

    #[test]
    fn open_interval_ms_out_of_range_is_named_by_its_path() {
        let text = format!("{VALID}probe:\n  open_interval_ms: 500\n");
        assert_eq!(
            parse("c.yaml", &text).unwrap_err().lines(),
            ["c.yaml: probe.open_interval_ms: must be 0 (off) or 1000–3600000, got 500"]
        );
    }

    #[test]
    fn unknown_fields_are_named_with_their_path_and_line() {
        let text = VALID.replace("upstream_model:", "upstream_modle:");
        let e = parse_err(&text);
        assert_eq!(e.path, "models[0].upstream_modle");
        assert!(e.message.starts_with("unknown field `upstream_modle`"), "{}", e.message);
        let (line, _) = e.location.unwrap();
        assert_eq!(line, 10);
        assert!(e.to_string().starts_with("catalog.yaml:10:"), "{e}");
    }

    #[test]
    fn wrong_values_name_the_field_once() {
        let text = VALID.replace("kind: openai", "kind: opnai");
        let e = parse_err(&text);
        assert_eq!(e.path, "providers[0].kind");
        assert!(!e.message.contains("providers[0]"), "path repeated: {}", e.message);
        assert!(!e.message.contains(" at line "), "position repeated: {}", e.message);
        assert!(e.message.contains("opnai"), "{}", e.message);
    }

    #[test]
    fn a_literal_secret_is_refused_without_echoing_it() {
        let text = VALID.replace("env:OPENAI_API_KEY", "sk-live-123");
        let e = parse_err(&text);
        assert_eq!(e.path, "providers[0].api_keys[0]");
        assert!(!e.to_string().contains("sk-live"), "{e}");
    }

    #[test]
    fn broken_yaml_reports_a_line() {
        let e = parse_err("providers: [\n  - name: x\n");
        assert!(e.location.is_some(), "{e}");
    }

    #[test]
    fn an_empty_file_is_an_empty_catalog() {
        assert_eq!(parse("c.yaml", "\n").unwrap(), Catalog::default());
    }

    #[test]
    fn yaml_output_reads_back_unchanged() {
        let c = parse("c.yaml", VALID).unwrap();
        let again = parse("c.yaml", &to_yaml(&c).unwrap()).unwrap();
        assert_eq!(c, again);
        let json = serde_json::to_string_pretty(&c).unwrap();
        assert_eq!(parse("c.json", &json).unwrap(), c);
    }

    #[test]
    fn the_example_catalog_parses_and_validates() {
        let text = include_str!("../../deploy/catalog.example.yaml");
        let c = parse("deploy/catalog.example.yaml", text).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.providers.is_empty() && !c.models.is_empty() && !c.webhooks.is_empty());
        assert_eq!(c.retry_policy.as_ref().map(|p| p.max_retries), Some(1));
        assert_eq!(c.probe.map(|p| (p.interval_ms, p.timeout_ms)), Some((30_000, 5_000)));
        assert_eq!(parse("c.yaml", &to_yaml(&c).unwrap()).unwrap(), c);
    }
}
