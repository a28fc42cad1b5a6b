//! HTML text for the console's pages: escaping, and the frame every page shares.
//!
//! Every value that comes from the store, a node or a form goes through [`esc`] before it
//! reaches a page (it may hold `<`, quotes or `&`: a model name is a user's choice).

use std::fmt::Write as _;

/// Text made safe for HTML element content and for double- or single-quoted attributes.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The console's pages, in the order of the navigation bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    Fleet,
    Breakers,
    Live,
    Drills,
    Keys,
    Webhooks,
}

impl Page {
    pub const ALL: [Page; 6] =
        [Page::Fleet, Page::Breakers, Page::Live, Page::Drills, Page::Keys, Page::Webhooks];

    pub fn path(self) -> &'static str {
        match self {
            Page::Fleet => "/ui/fleet",
            Page::Breakers => "/ui/breakers",
            Page::Live => "/ui/live",
            Page::Drills => "/ui/drills",
            Page::Keys => "/ui/keys",
            Page::Webhooks => "/ui/webhooks",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Page::Fleet => "Fleet",
            Page::Breakers => "Breakers",
            Page::Live => "Failovers (live)",
            Page::Drills => "Drills",
            Page::Keys => "Keys",
            Page::Webhooks => "Webhooks",
        }
    }
}

/// A whole page: navigation (with the sign-out form, which carries the CSRF token) and body.
pub fn page(current: Option<Page>, csrf: Option<&str>, body: &str) -> String {
    let title = current.map_or("Sign in", Page::title);
    let mut nav = String::new();
    if let Some(csrf) = csrf {
        nav.push_str("<nav aria-label=\"Console pages\"><ul>");
        for p in Page::ALL {
            let here = if Some(p) == current { " aria-current=\"page\"" } else { "" };
            let _ = write!(nav, "<li><a href=\"{}\"{here}>{}</a></li>", p.path(), p.title());
        }
        let _ = write!(
            nav,
            "</ul><form method=\"post\" action=\"/ui/logout\" class=\"logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\">Sign out</button></form></nav>",
            esc(csrf)
        );
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · Switchyard console</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\">\
         <script src=\"/ui/static/console.js\" defer></script></head>\
         <body><a class=\"skip\" href=\"#main\">Skip to the page</a>\
         <header><a class=\"brand\" href=\"/ui/fleet\">Switchyard</a>{nav}</header>\
         <main id=\"main\"><h1>{title}</h1>{body}</main></body></html>\n"
    )
}

/// A table with a caption, its header cells and rows of already-escaped cells; a row
/// saying `empty` when there are none.
pub fn table(id: &str, caption: &str, head: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    let mut out =
        format!("<table id=\"{}\"><caption>{}</caption><thead><tr>", esc(id), esc(caption));
    for h in head {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr class=\"empty\"><td colspan=\"{}\">{}</td></tr>",
            head.len(),
            esc(empty)
        );
    }
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A time as the page shows it: RFC 3339 in UTC (what the CLI prints), or "never".
pub fn time(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "never".into();
    }
    esc(&switchyard_time::rfc3339_ms(unix_ms))
}

/// How long ago `unix_ms` was, as `1.2s`, `3m4s`.
pub fn age(now_ms: i64, unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "never".into();
    }
    let ms = u64::try_from(now_ms.saturating_sub(unix_ms)).unwrap_or(0);
    esc(&switchyard_time::format_duration(std::time::Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_escaped_for_content_and_attributes() {
        assert_eq!(
            esc(r#"<script>alert('x')</script> & "q""#),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        let t = table("t", "c", &["a"], &[], "<none>");
        assert!(t.contains("&lt;none&gt;") && !t.contains("<none>"));
    }
}
