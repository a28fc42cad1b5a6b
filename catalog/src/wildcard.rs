//! Wildcard model names (docs/catalog.md, "Wildcard models"): `openai/*` stands for every
//! `openai/<rest>`, in the catalog and in keys' allow-lists.

/// The prefix of a wildcard name (`openai/` of `openai/*`), `None` for any other name.
/// Validation lets `*` stand only as the whole last path segment, after at least one other.
pub fn wildcard_prefix(name: &str) -> Option<&str> {
    name.strip_suffix('*').filter(|prefix| prefix.len() > 1 && prefix.ends_with('/'))
}

/// What follows `prefix` in `name`, when `name` starts with it and has more.
pub fn rest_under<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(prefix).filter(|rest| !rest.is_empty())
}

/// Whether a key whose `allowed_models` is `allowed` may use the model `name`: an empty list
/// allows every model; an entry allows its own name, and a wildcard entry (`openai/*`) every
/// name under it (`openai/gpt-5`, `openai/*` itself, a narrower `openai/ft/*`).
pub fn model_allowed(allowed: &[String], name: &str) -> bool {
    allowed.is_empty()
        || allowed
            .iter()
            .any(|a| a == name || wildcard_prefix(a).is_some_and(|p| rest_under(p, name).is_some()))
}
