//! Form bodies (`application/x-www-form-urlencoded`) and query strings.

/// The fields of a form body or query string, in order.
pub fn form(body: &[u8]) -> Vec<(String, String)> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

/// The first value of field `name`.
pub fn field<'f>(fields: &'f [(String, String)], name: &str) -> Option<&'f str> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}
