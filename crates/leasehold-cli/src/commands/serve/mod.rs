//! `leasehold serve`: a web page of the leases under a prefix and of the queue, live over
//! server-sent events, the same data as JSON, and force release behind a flag and a token.
//!
//! - `look`: what is shown and the task that follows its changes;
//! - `page`: the HTML (with `page.html`, `serve.js`, `serve.css`);
//! - this file: the routes, the token, the command.

mod look;
mod page;

use crate::cli::ServeArgs;
use crate::exit::{self, Failure, OK};
use crate::output::print;
use crate::process::signals::Forwarded;
use crate::records::{inspection_json, record_json};
use crate::store;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use leasehold::{now_ms, Key, LockStore};
use look::{Look, QueueSource, Sources};
use page::Context;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::io::Read as _;
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

/// What every request handler shares.
#[derive(Debug, Clone)]
struct Shared {
    sources: Sources,
    cx: Context,
    /// The force-release token when force release is allowed.
    token: Option<Arc<str>>,
    /// The latest look that differed from the one before (the live updates).
    looks: watch::Receiver<Arc<Look>>,
    /// Host names besides IP addresses and `localhost` that requests may name (`--allow-host`).
    hosts: Arc<[String]>,
}

/// `leasehold serve`: the keys under `prefix`; with `--allow-force-release`, the token of
/// `--token-file` (`given`, read before dispatch), else one made up.
pub(crate) async fn serve(
    store_url: Option<&str>,
    args: ServeArgs,
    prefix: String,
    given: Option<String>,
) -> Result<u8, Failure> {
    let (token, made_up) = match (args.allow_force_release, given) {
        (false, _) => (None, false),
        (true, Some(token)) => (Some(token), false),
        (true, None) => (Some(make_token()?), true),
    };
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let store = store::open(store_url).await?;
    // A queue named is opened (and created) as every queue command does; the default one is
    // shown only once it exists: a read-only page creates nothing.
    let queue = match args
        .queue
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty())
    {
        Some(url) => QueueSource::Named(store::open_queue(Some(url)).await?),
        None => QueueSource::default_queue(),
    };
    let cx = Context {
        store: leasehold::redact_url(&store.describe()),
        queue: leasehold::redact_url(&leasehold::defaults::queue_url(args.queue.as_deref())),
        prefix: prefix.clone(),
        release: token.is_some(),
    };
    let sources = Sources {
        store,
        queue,
        prefix,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::error(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::error(format!("cannot listen on {}: {e}", args.listen)))?;
    let (tx, looks) = watch::channel(Arc::new(sources.look().await));
    let follower = tokio::spawn(look::follow(sources.clone(), args.every, tx));
    let shared = Shared {
        sources,
        cx,
        token: token.as_deref().map(Arc::from),
        looks,
        hosts: args.allow_host.clone().into(),
    };
    if shared.token.is_some() && !addr.ip().is_loopback() {
        exit::report(&format!(
            "force release is allowed on {addr}, not a loopback address: its token travels \
             unencrypted (put a TLS proxy in front)"
        ));
    }
    print(&format!("serving http://{addr}/\n"))?;
    if let (true, Some(t)) = (made_up, &token) {
        print(&format!("force-release token: {t}\n"))?;
    }
    let served = axum::serve(listener, router(shared));
    let result = tokio::select! {
        r = async { served.await } => r
            .map(|()| OK)
            .map_err(|e| Failure::error(format!("serving on {addr}: {e}"))),
        _ = signals.recv() => Ok(OK),
    };
    follower.abort();
    result
}

/// The routes.
fn router(shared: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/serve.js", get(script))
        .route("/serve.css", get(style))
        .route("/events", get(events))
        .route("/api/leases", get(api_leases))
        .route("/api/queue", get(api_queue))
        .route("/api/release", post(api_release))
        .layer(axum::middleware::map_response(security_headers))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            check_host,
        ))
        .with_state(shared)
}

/// Refuses a request whose `Host` names this server by a DNS name not allowed: a page on another
/// site that points its own name at this machine (DNS rebinding) would otherwise read it with
/// the browser's help. An IP address, `localhost` and the `--allow-host` names are allowed; a
/// request without `Host` (not a browser's) too.
async fn check_host(
    State(shared): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(host) = req.headers().get(header::HOST) {
        let allowed = host.to_str().is_ok_and(|h| host_allowed(h, &shared.hosts));
        if !allowed {
            return (
                StatusCode::FORBIDDEN,
                "this page answers to IP addresses, localhost and the names given with \
                 --allow-host\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Whether `host` (a `Host` header: a name or address, with or without a port) is an IP
/// address, `localhost`, or one of `allowed`.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // [v6] or [v6]:port
        Some(rest) => {
            return rest
                .split_once(']')
                .is_some_and(|(v6, _)| v6.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Headers on every answer: no script but the page's own, no framing, no sniffing.
async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn index(State(s): State<Shared>) -> Response {
    let look = s.sources.look().await;
    let html = page::page(&s.cx, &look, now_ms());
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("serve.js"),
    )
        .into_response()
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("serve.css"),
    )
        .into_response()
}

/// A JSON answer.
fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{v}\n"),
    )
        .into_response()
}

/// An error as `{"error": …, "message": …}`.
fn error_response(status: StatusCode, error: &str, message: &str) -> Response {
    json_response(status, &json!({ "error": error, "message": message }))
}

/// `GET /api/leases`: `ls --json` of the prefix.
async fn api_leases(State(s): State<Shared>) -> Response {
    match s.sources.leases().await {
        Ok(all) => {
            let now = now_ms();
            json_response(
                StatusCode::OK,
                &Value::Array(all.iter().map(|i| inspection_json(i, now)).collect()),
            )
        }
        Err(e) => error_response(StatusCode::BAD_GATEWAY, "store", &e.to_string()),
    }
}

/// `GET /api/queue`: `queue status --json`; 404 with `{"error": "no queue", …}` while the
/// default queue does not exist.
async fn api_queue(State(s): State<Shared>) -> Response {
    match s.sources.queue.status().await {
        None => error_response(StatusCode::NOT_FOUND, "no queue", &page::no_queue(&s.cx)),
        Some(Ok(status)) => match serde_json::to_value(&status) {
            Ok(v) => json_response(StatusCode::OK, &v),
            Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, "json", &e.to_string()),
        },
        Some(Err(e)) => error_response(StatusCode::BAD_GATEWAY, "queue", &e.to_string()),
    }
}

/// `GET /events`: an `update` event with both sections' HTML now and at every change.
async fn events(State(s): State<Shared>) -> Response {
    let cx = s.cx.clone();
    let stream = futures_util::stream::unfold((s.looks, true), move |(mut rx, first)| {
        let cx = cx.clone();
        async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let look = rx.borrow_and_update().clone();
            let now = now_ms();
            let data = json!({
                "leases": page::leases(&cx, &look, now),
                "queue": page::queue(&cx, &look, now),
            });
            // JSON escapes every control character: the data is one line.
            let event = Event::default().event("update").data(data.to_string());
            Some((Ok::<_, Infallible>(event), (rx, false)))
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `POST /api/release`: `{"key": KEY}` (and `"holder": ID`) with `Authorization: Bearer TOKEN`
/// frees the lease (or the holder's permits) as `release --force` does.
async fn api_release(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(token) = &s.token else {
        return error_response(
            StatusCode::FORBIDDEN,
            "forbidden",
            "force release is off: start `leasehold serve` with --allow-force-release",
        );
    };
    if !authorized(&headers, token) {
        let mut res = error_response(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a force release needs the header `Authorization: Bearer TOKEN` with serve's token",
        );
        res.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return res;
    }
    let (key, holder) = match release_request(&body) {
        Ok(r) => r,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, "bad request", &message),
    };
    let store: &dyn LockStore = &*s.sources.store;
    let now = now_ms();
    let was = match &holder {
        None => store.force_release(&key).await,
        Some(who) => store.force_release_holder(&key, who).await,
    };
    match was {
        Ok(was) => {
            let message = match &was {
                Some(r) if r.token.is_some() || r.permits.is_some() => {
                    tracing::warn!(key = %key, holder = ?r.holder, fence = r.fence, by = "serve", "force-released");
                    format!("released {:?}", key.as_str())
                }
                _ => format!("{:?}: nothing held; nothing to release", key.as_str()),
            };
            json_response(
                StatusCode::OK,
                &json!({
                    "key": key.as_str(),
                    "message": message,
                    "was": was.as_ref().map(|r| record_json(r, now)),
                }),
            )
        }
        Err(e) => error_response(StatusCode::BAD_GATEWAY, "store", &e.to_string()),
    }
}

/// Whether `headers` carry `Authorization: Bearer TOKEN` with this token (compared in constant
/// time).
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
    else {
        return false;
    };
    bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

/// The key (and holder) of a release request's JSON body.
fn release_request(body: &[u8]) -> Result<(Key, Option<String>), String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let key = v
        .get("key")
        .and_then(Value::as_str)
        .ok_or("the body needs \"key\": a string")?;
    let key = Key::new(key).map_err(|e| e.to_string())?;
    let holder = match v.get("holder") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) if !h.is_empty() => Some(h.clone()),
        Some(_) => return Err("\"holder\" must be a non-empty string".into()),
    };
    Ok((key, holder))
}

/// A new token: 32 random bytes from the kernel, in hex.
fn make_token() -> Result<String, Failure> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Failure::error(format!("cannot make a token from /dev/urandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_bearer_token_passes() {
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, "secret-token-123"));
        for (given, ok) in [
            ("Bearer secret-token-123", true),
            ("bearer secret-token-123", true),
            ("Bearer secret-token-124", false),
            ("Bearer secret", false),
            ("Basic secret-token-123", false),
            ("secret-token-123", false),
        ] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(given));
            assert_eq!(authorized(&h, "secret-token-123"), ok, "{given}");
        }
    }

    #[test]
    fn release_requests_are_checked() {
        assert!(release_request(br#"{"key":"a"}"#).is_ok());
        assert_eq!(
            release_request(br#"{"key":"a","holder":"h"}"#)
                .unwrap()
                .1
                .as_deref(),
            Some("h")
        );
        for bad in [
            &b"not json"[..],
            br#"{}"#,
            br#"{"key":""}"#,
            br#"{"key":"a","holder":3}"#,
        ] {
            assert!(
                release_request(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(make_token().unwrap().len(), 64);
    }

    #[test]
    fn hosts_a_rebinding_page_cannot_use() {
        let allowed = ["locks.example.com".to_owned()];
        for ok in [
            "127.0.0.1:7474",
            "127.0.0.1",
            "10.0.0.5:80",
            "[::1]:7474",
            "[::1]",
            "localhost:7474",
            "LOCALHOST",
            "locks.example.com:7474",
            "Locks.Example.Com",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for refused in [
            "evil.example:7474",
            "evil.example",
            "127.0.0.1.evil.example",
            "localhost.evil.example:7474",
            "[::1",
            "[evil]:80",
            "",
            "locks.example.com.evil:7474",
        ] {
            assert!(!host_allowed(refused, &allowed), "{refused}");
        }
    }
}
