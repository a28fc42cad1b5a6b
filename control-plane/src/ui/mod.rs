//! The web console (docs/operating.md, "The console"): HTML pages on the control plane's
//! own listener and TLS, at `/ui`, for whoever holds the admin token.
//!
//! The pages read what the admin API reads, in process: each handler calls the same
//! [`AdminService`] methods the gRPC calls reach, so the console shows exactly what
//! `switchyard nodes`, `breakers`, `events`, `keys`, `usage` and `webhooks` print. Only
//! two things change state: starting a drill and clearing faults.
//!
//! Every page is whole HTML that reads without JavaScript (tables, forms, links); the
//! small script only adds what needs it: the live failovers (server-sent events) and
//! tables that refresh in place. Nothing is loaded from anywhere but this listener, and
//! the `Content-Security-Policy` says so to the browser.

mod auth;
pub mod drill;
mod form;
mod html;
mod pages;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use tonic::transport::server::TcpConnectInfo;

use crate::admin::AdminService;
use auth::{Credentials, WrongTokens};
use drill::DrillRun;
use form::{field, form};
use html::Page;

/// The console's stylesheet and script, served from the binary.
const CSS: &str = include_str!("static/console.css");
const JS: &str = include_str!("static/console.js");

/// Nothing but this listener: no CDN, no inline script, no framing by other sites.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// Largest form body the console reads (a drill form is a few hundred bytes).
const MAX_FORM_BYTES: usize = 16 * 1024;
/// Drills a replica remembers for its drills page.
const KEPT_DRILLS: usize = 20;
/// A comment line on the event stream this often, so proxies keep an idle stream open.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

pub struct Console {
    admin: AdminService,
    credentials: Credentials,
    wrong: WrongTokens,
    drills: Mutex<VecDeque<DrillRun>>,
    next_drill: AtomicU64,
}

/// The console's routes, to merge into the listener's router.
pub fn router(admin: AdminService, admin_token: &str, tls: bool) -> Router {
    let console = Arc::new(Console {
        admin,
        credentials: Credentials::new(admin_token, tls),
        wrong: WrongTokens::default(),
        drills: Mutex::new(VecDeque::new()),
        next_drill: AtomicU64::new(1),
    });
    Router::new()
        .route("/ui", get(home))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/static/console.css", get(|| async { asset("text/css; charset=utf-8", CSS) }))
        .route(
            "/ui/static/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
        .route("/ui/fleet", get(fleet))
        .route("/ui/breakers", get(breakers))
        .route("/ui/live", get(live))
        .route("/ui/live/stream", get(live_stream))
        .route("/ui/drills", get(drills).post(start_drill))
        .route("/ui/drills/run", get(drill_run))
        .route("/ui/drills/clear", post(clear_faults))
        .route("/ui/keys", get(keys))
        .route("/ui/webhooks", get(webhooks))
        .route("/ui/{*rest}", get(not_found))
        .with_state(console)
}

type Shared = State<Arc<Console>>;

// === responses ===

/// Headers every console answer carries.
fn secured(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null`
    // with the console's own form posts, and the origin check of its forms would refuse them.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Pages hold fleet data: never kept by the browser or a proxy for the next user.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn html(status: StatusCode, body: String) -> Response {
    secured((status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response())
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    secured(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

fn redirect(to: &str) -> Response {
    secured((StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response())
}

async fn not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        html::page(None, None, "<p>No such console page. <a href=\"/ui\">To the console</a></p>"),
    )
}

fn peer(request: &Request) -> Option<IpAddr> {
    request.extensions().get::<TcpConnectInfo>().and_then(|i| i.remote_addr()).map(|a| a.ip())
}

async fn read_form(request: Request) -> Result<(HeaderMap, Vec<(String, String)>), Response> {
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, MAX_FORM_BYTES).await {
        Ok(bytes) => Ok((parts.headers, form(&bytes))),
        Err(_) => Err(html(
            StatusCode::PAYLOAD_TOO_LARGE,
            html::page(None, None, "<p>The form is too large.</p>"),
        )),
    }
}

// === signing in ===

async fn home(State(c): Shared, headers: HeaderMap) -> Response {
    redirect(if c.credentials.signed_in(&headers) { "/ui/fleet" } else { "/ui/login" })
}

async fn login_form(State(c): Shared, headers: HeaderMap) -> Response {
    if c.credentials.signed_in(&headers) {
        return redirect("/ui/fleet");
    }
    html(StatusCode::OK, html::page(None, None, &pages::login(None)))
}

async fn login(State(c): Shared, request: Request) -> Response {
    let peer = peer(&request);
    let (_, fields) = match read_form(request).await {
        Ok(form) => form,
        Err(response) => return response,
    };
    let now = Instant::now();
    if !c.wrong.allowed(peer, now) {
        return html(
            StatusCode::TOO_MANY_REQUESTS,
            html::page(None, None, &pages::login(Some("Too many failed sign-ins; wait a minute."))),
        );
    }
    let token = field(&fields, "token").unwrap_or("");
    if token.is_empty() || !c.credentials.token_matches(token) {
        c.wrong.record_wrong(peer, now);
        // Generic: whether the field was empty or wrong, nothing about the token is said.
        return html(
            StatusCode::UNAUTHORIZED,
            html::page(None, None, &pages::login(Some("Sign-in failed."))),
        );
    }
    let mut response = redirect("/ui/fleet");
    if let Ok(cookie) = HeaderValue::from_str(&c.credentials.cookie_for(token)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

async fn logout(State(c): Shared, request: Request) -> Response {
    let (headers, fields) = match read_form(request).await {
        Ok(form) => form,
        Err(response) => return response,
    };
    if !c.credentials.form_is_ours(&headers, field(&fields, "csrf")) {
        return forbidden();
    }
    let mut response = redirect("/ui/login");
    if let Ok(cookie) = HeaderValue::from_str(&c.credentials.cleared_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

fn forbidden() -> Response {
    html(
        StatusCode::FORBIDDEN,
        html::page(
            None,
            None,
            "<p>This form did not come from this console. <a href=\"/ui\">Back to the console</a></p>",
        ),
    )
}

// === pages ===

/// A page for a signed-in browser; the sign-in page for any other (never data).
async fn show<F>(c: &Console, headers: &HeaderMap, page: Page, body: F) -> Response
where
    F: std::future::Future<Output = Result<String, tonic::Status>>,
{
    if !c.credentials.signed_in(headers) {
        return redirect("/ui/login");
    }
    let (status, body) = match body.await {
        Ok(body) => (StatusCode::OK, body),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "<p class=\"error\" role=\"alert\">Could not read this page's data: {}</p>",
                html::esc(e.message())
            ),
        ),
    };
    html(status, html::page(Some(page), Some(c.credentials.csrf()), &body))
}

async fn fleet(State(c): Shared, headers: HeaderMap) -> Response {
    show(&c, &headers, Page::Fleet, pages::fleet(&c.admin)).await
}

async fn breakers(State(c): Shared, headers: HeaderMap) -> Response {
    show(&c, &headers, Page::Breakers, pages::breakers(&c.admin)).await
}

async fn live(State(c): Shared, headers: HeaderMap) -> Response {
    show(&c, &headers, Page::Live, pages::live(&c.admin)).await
}

async fn keys(State(c): Shared, headers: HeaderMap) -> Response {
    show(&c, &headers, Page::Keys, pages::keys(&c.admin)).await
}

async fn webhooks(State(c): Shared, headers: HeaderMap) -> Response {
    show(&c, &headers, Page::Webhooks, pages::webhooks(&c.admin)).await
}

async fn drills(State(c): Shared, headers: HeaderMap) -> Response {
    let runs = c.runs();
    show(&c, &headers, Page::Drills, pages::drills(&c.admin, c.credentials.csrf(), &runs, None))
        .await
}

async fn drill_run(State(c): Shared, headers: HeaderMap, uri: http::Uri) -> Response {
    let id = uri
        .query()
        .map(|q| form(q.as_bytes()))
        .and_then(|q| field(&q, "id").and_then(|v| v.parse::<u64>().ok()));
    let run = id.and_then(|id| c.runs().into_iter().find(|r| r.id == id));
    let Some(run) = run else {
        return show(&c, &headers, Page::Drills, async {
            Ok::<_, tonic::Status>("<p class=\"error\" role=\"alert\">No such drill on this control plane. <a href=\"/ui/drills\">All drills</a></p>".to_owned())
        })
        .await;
    };
    show(&c, &headers, Page::Drills, pages::drill_run(&c.admin, c.credentials.csrf(), &run)).await
}

/// The fields of a form posted by a signed-in admin from one of our pages; else the answer
/// to send instead (the sign-in page, or a refusal of a form posted from elsewhere).
async fn signed_form(c: &Console, request: Request) -> Result<Vec<(String, String)>, Response> {
    let (headers, fields) = read_form(request).await?;
    if !c.credentials.signed_in(&headers) {
        return Err(redirect("/ui/login"));
    }
    if !c.credentials.form_is_ours(&headers, field(&fields, "csrf")) {
        return Err(forbidden());
    }
    Ok(fields)
}

async fn start_drill(State(c): Shared, request: Request) -> Response {
    let fields = match signed_form(&c, request).await {
        Ok(fields) => fields,
        Err(response) => return response,
    };
    let id = c.next_drill.fetch_add(1, Ordering::Relaxed);
    match pages::start_drill(&c.admin, &fields, id).await {
        Ok(run) => {
            let to = format!("/ui/drills/run?id={}", run.id);
            if let Ok(mut drills) = c.drills.lock() {
                drills.push_front(run);
                drills.truncate(KEPT_DRILLS);
            }
            redirect(&to)
        }
        // The form again, each bad field named, with what was typed (escaped) kept.
        Err(problems) => {
            let runs = c.runs();
            let body = pages::drills(
                &c.admin,
                c.credentials.csrf(),
                &runs,
                Some((fields.as_slice(), &problems)),
            )
            .await;
            match body {
                Ok(body) => html(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    html::page(Some(Page::Drills), Some(c.credentials.csrf()), &body),
                ),
                Err(e) => html(
                    StatusCode::SERVICE_UNAVAILABLE,
                    html::page(
                        Some(Page::Drills),
                        Some(c.credentials.csrf()),
                        &html::esc(e.message()),
                    ),
                ),
            }
        }
    }
}

async fn clear_faults(State(c): Shared, request: Request) -> Response {
    let fields = match signed_form(&c, request).await {
        Ok(fields) => fields,
        Err(response) => return response,
    };
    let names: Vec<String> =
        fields.iter().filter(|(n, _)| n == "name").map(|(_, v)| v.clone()).collect();
    let all = field(&fields, "all") == Some("1");
    match pages::clear_faults(&c.admin, &names, all).await {
        Ok(()) => redirect(
            field(&fields, "back").filter(|b| b.starts_with("/ui/drills")).unwrap_or("/ui/drills"),
        ),
        Err(e) => html(
            StatusCode::BAD_REQUEST,
            html::page(
                Some(Page::Drills),
                Some(c.credentials.csrf()),
                &format!(
                    "<p class=\"error\" role=\"alert\">{}</p><p><a href=\"/ui/drills\">Back to drills</a></p>",
                    html::esc(&e)
                ),
            ),
        ),
    }
}

impl Console {
    fn runs(&self) -> Vec<DrillRun> {
        self.drills.lock().map(|d| d.iter().cloned().collect()).unwrap_or_default()
    }
}

/// The audit log's new failover events as server-sent events, each a JSON row of text
/// cells that the script puts into the live table with `textContent` (never as markup).
async fn live_stream(State(c): Shared, headers: HeaderMap) -> Response {
    if !c.credentials.signed_in(&headers) {
        return secured((StatusCode::UNAUTHORIZED, "sign in to the console first").into_response());
    }
    let mut events = match pages::follow_events(&c.admin).await {
        Ok(events) => events,
        Err(e) => {
            return secured(
                (StatusCode::SERVICE_UNAVAILABLE, e.message().to_owned()).into_response(),
            );
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut keepalive = tokio::time::interval(SSE_KEEPALIVE);
        loop {
            let chunk = tokio::select! {
                _ = tx.closed() => return,
                _ = keepalive.tick() => Bytes::from_static(b": keep-alive\n\n"),
                next = events.next() => match next {
                    Some(Ok(event)) => pages::sse_event(&event),
                    // The replica stops or the store ended the watch: the browser's
                    // EventSource reconnects by itself.
                    Some(Err(_)) | None => return,
                },
            };
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    secured(
        ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-store")], body)
            .into_response(),
    )
}
