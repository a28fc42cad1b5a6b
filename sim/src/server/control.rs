//! The `/_sim/` control API: scripts, accepted keys, stats, last requests, reset.

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;

use super::query::{percent_decode, query_param};
use super::response::{HttpResponse, json_value, no_content};
use super::state::State;
use crate::behaviour::{Behaviour, Script};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptOne {
    model: String,
    behaviour: Behaviour,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptBody {
    One(ScriptOne),
    Many(Script),
}

pub async fn handle(state: &State, req: Request<Incoming>) -> HttpResponse {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return control_error(StatusCode::BAD_REQUEST, "could not read the request body"),
    };
    let route = path.trim_start_matches("/_sim/");
    match (&method, route) {
        (&Method::GET, "stats") => json_value(StatusCode::OK, &state.stats()),
        (&Method::POST, "reset") => {
            state.reset();
            no_content()
        }
        (&Method::PUT, "keys") => match serde_json::from_slice::<Vec<String>>(&body) {
            Ok(keys) => {
                *state.keys.lock() = keys;
                no_content()
            }
            Err(e) => control_error(StatusCode::BAD_REQUEST, &format!("keys: {e}")),
        },
        (&Method::GET, "keys") => json_value(StatusCode::OK, &*state.keys.lock()),
        (&Method::POST, "script") => match serde_json::from_slice::<ScriptBody>(&body) {
            Ok(ScriptBody::One(one)) => {
                state.set(one.model, one.behaviour);
                no_content()
            }
            Ok(ScriptBody::Many(script)) => {
                for (model, behaviour) in script {
                    state.set(model, behaviour);
                }
                no_content()
            }
            // The untagged error says nothing useful; name what each form expects.
            Err(_) => match serde_json::from_slice::<ScriptOne>(&body) {
                Err(e) => control_error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "expected {{\"model\": ..., \"behaviour\": {{\"kind\": ...}}}} or a map of model to behaviour: {e}"
                    ),
                ),
                Ok(_) => control_error(StatusCode::BAD_REQUEST, "invalid script"),
            },
        },
        (&Method::GET, "last_request") => {
            let Some(model) = query.as_deref().and_then(|q| query_param(q, "model")) else {
                return control_error(StatusCode::BAD_REQUEST, "last_request needs ?model=<model>");
            };
            let last = state.models.lock().get(&model).and_then(|m| m.last.clone());
            match last {
                Some(last) => json_value(
                    StatusCode::OK,
                    &serde_json::json!({
                        "model": model,
                        "path": last.path(),
                        "headers": last.headers(),
                        "body": last.body_json(),
                    }),
                ),
                None => control_error(
                    StatusCode::NOT_FOUND,
                    &format!("no request seen for model {model:?}"),
                ),
            }
        }
        (method, route) if route.starts_with("models/") => {
            let model = percent_decode(&route["models/".len()..]);
            if model.is_empty() {
                return control_error(StatusCode::BAD_REQUEST, "missing model name");
            }
            match *method {
                Method::PUT | Method::POST => match serde_json::from_slice::<Behaviour>(&body) {
                    Ok(behaviour) => {
                        state.set(model, behaviour);
                        no_content()
                    }
                    Err(e) => control_error(StatusCode::BAD_REQUEST, &format!("behaviour: {e}")),
                },
                Method::GET => json_value(StatusCode::OK, &state.behaviour(&model)),
                Method::DELETE => {
                    state.unset(&model);
                    no_content()
                }
                _ => control_error(StatusCode::METHOD_NOT_ALLOWED, "use PUT, GET or DELETE"),
            }
        }
        _ => control_error(StatusCode::NOT_FOUND, &format!("no control route {method} {path}")),
    }
}

fn control_error(status: StatusCode, message: &str) -> HttpResponse {
    json_value(status, &serde_json::json!({ "error": message }))
}
