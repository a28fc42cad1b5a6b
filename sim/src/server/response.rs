//! Response builders every wire format's handler uses: JSON bodies, SSE streams, request ids.

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::body::SimBody;

pub type HttpResponse = Response<SimBody>;

pub fn json_response(status: StatusCode, body: Bytes) -> HttpResponse {
    let mut resp = Response::new(SimBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub fn json_value<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> HttpResponse {
    let body = serde_json::to_vec(value).unwrap_or_default();
    json_response(status, Bytes::from(body))
}

pub fn no_content() -> HttpResponse {
    let mut resp = Response::new(SimBody::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    resp
}

/// An SSE response around `body`, with the request id in `header_name`.
pub fn stream_response(body: SimBody, header_name: &'static str, request_id: &str) -> HttpResponse {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    insert_header(&mut resp, header_name, request_id);
    resp
}

/// Sets a header whose value came from elsewhere (a request id, a number); a value that is
/// not a valid header is left out rather than failing the response.
pub fn insert_header(resp: &mut HttpResponse, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, value);
    }
}

/// The status of an error body, 500 for one hyper cannot send.
pub fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// What a scripted `ok` answers: its text, else "Hello from <model>.".
pub fn reply_text(text: Option<&str>, model: &str) -> String {
    match text {
        Some(text) => text.to_owned(),
        None => format!("Hello from {model}."),
    }
}
