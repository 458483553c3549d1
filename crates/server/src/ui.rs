//! The web chat UI: the repository's `web/` folder, embedded into the binary at build time
//! (rust-embed; debug builds read the folder from disk so the page can be edited live), served
//! at `/` with a strict Content-Security-Policy.
//!
//! ```text
//! GET /                  -> web/index.html
//! GET /style.css, /js/*, /vendor/* ... -> the embedded file, by exact path (no catch-all route,
//!                           so unknown paths still get the API's JSON 404)
//! ```
//!
//! Every response carries the CSP below (only the page's own origin, no inline script or style,
//! no framing), `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`, and an ETag
//! (the file's SHA-256) so a reload revalidates cheaply (`Cache-Control: no-cache`).

use axum::{
    body::Body,
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::Response,
    routing::get,
    Router,
};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "../../web/"]
#[exclude = "*.map"]
struct Assets;

/// Content-Security-Policy of every UI response: the page's own origin only. `connect-src 'self'`
/// covers the same-origin WebSocket (`ws:`/`wss:` to this host) in CSP Level 3 browsers.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
frame-ancestors 'none'";

/// Routes for every embedded file (plus `/` for `index.html`), to merge into the server's router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut r = Router::new().route("/", get(|h: HeaderMap| async move { serve("index.html", &h) }));
    for path in Assets::iter() {
        let path = path.into_owned();
        let route = format!("/{path}");
        r = r.route(&route, get(move |h: HeaderMap| async move { serve(&path, &h) }));
    }
    r
}

/// Content type by extension; `.md` and license files are shown as plain text.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, e)| e).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" => "application/json",
        "woff2" => "font/woff2",
        _ => "text/plain; charset=utf-8",
    }
}

fn serve(path: &str, req: &HeaderMap) -> Response {
    let Some(file) = Assets::get(path) else {
        // Listed at start-up but gone (debug build reading web/ from disk): a plain 404.
        return with_security_headers(Response::builder().status(StatusCode::NOT_FOUND)).body(Body::from("not found")).unwrap_or_default();
    };
    let etag = format!("\"{}\"", hex::encode(file.metadata.sha256_hash()));
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let builder = with_security_headers(Response::builder()).header(header::ETAG, &etag).header(header::CACHE_CONTROL, "no-cache");
    if fresh {
        return builder.status(StatusCode::NOT_MODIFIED).body(Body::empty()).unwrap_or_default();
    }
    builder.header(header::CONTENT_TYPE, content_type(path)).body(Body::from(file.data.into_owned())).unwrap_or_default()
}

fn with_security_headers(b: axum::http::response::Builder) -> axum::http::response::Builder {
    b.header(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP))
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::REFERRER_POLICY, "no-referrer")
        .header(header::X_FRAME_OPTIONS, "DENY")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;
    use tower::ServiceExt;

    async fn get(path: &str, etag: Option<&str>) -> Response {
        let mut req = axum::http::Request::get(path);
        if let Some(e) = etag {
            req = req.header(header::IF_NONE_MATCH, e);
        }
        router::<()>().oneshot(req.body(Body::empty()).unwrap()).await.unwrap()
    }

    #[tokio::test]
    async fn index_has_csp_and_module_script() {
        let res = get("/", None).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        // Only the page's own origin (or nothing) in every directive.
        for directive in CSP.split(';') {
            let mut words = directive.split_whitespace();
            let name = words.next().unwrap();
            assert!(words.all(|w| w == "'self'" || w == "'none'"), "{name} allows more than 'self'");
        }
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let body = to_bytes(res.into_body(), 1 << 20).await.unwrap();
        let html = std::str::from_utf8(&body).unwrap();
        assert!(html.contains(r#"<script type="module" src="js/app.js">"#));
        // The CSP forbids inline code: the page must not rely on any.
        assert!(!html.contains("<script>") && !html.contains(" style=") && !html.contains(" onclick="));
    }

    #[tokio::test]
    async fn every_embedded_script_is_javascript_and_revalidates() {
        let mut scripts = 0;
        for path in Assets::iter() {
            if !(path.ends_with(".js") || path.ends_with(".mjs")) {
                continue;
            }
            scripts += 1;
            let res = get(&format!("/{path}"), None).await;
            assert_eq!(res.status(), StatusCode::OK, "{path}");
            assert_eq!(res.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8", "{path}");
            let etag = res.headers()[header::ETAG].to_str().unwrap().to_owned();
            let again = get(&format!("/{path}"), Some(&etag)).await;
            assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        }
        assert!(scripts >= 8, "app modules and vendored libraries are embedded ({scripts})");
    }

    #[tokio::test]
    async fn unknown_paths_are_not_served() {
        for p in ["/nope.js", "/js/../Cargo.toml", "/vendor", "/web/index.html"] {
            assert_eq!(get(p, None).await.status(), StatusCode::NOT_FOUND, "{p}");
        }
    }
}
