//! `cargo fuzz run request_json`: any body on every JSON route of the HTTP API gets an answer
//! from the router: a 4xx with an error body or a success, never a panic and never a 500. Input: a route selector byte, then
//! the body.
#![no_main]
mod common;
use axum::body::Body;
use axum::http::Request;
use common::NoEngines;
use quarrel_server::{AppState, Registry, ServerConfig};
use std::sync::{Arc, OnceLock};
use tower::ServiceExt;

const ROUTES: [&str; 10] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/api/generate",
    "/api/chat",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
    "/api/stream",
    "/api/models/m/load",
];

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

fn state() -> &'static AppState {
    static S: OnceLock<AppState> = OnceLock::new();
    S.get_or_init(|| AppState::new(ServerConfig::default(), Registry::new(Arc::new(NoEngines), 0, false), None).unwrap())
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let route = ROUTES[sel as usize % ROUTES.len()];
    let req = Request::post(route).header("content-type", "application/json").body(Body::from(body.to_vec())).unwrap();
    let status = rt().block_on(async { quarrel_server::routes::router(state().clone()).oneshot(req).await.unwrap().status() });
    assert!(status.as_u16() != 500, "{route}: 500 for {:?}", String::from_utf8_lossy(body));
});
