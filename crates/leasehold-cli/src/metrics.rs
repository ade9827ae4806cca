//! `--metrics ADDR`: the process's Prometheus metrics at `http://ADDR/metrics`, in the text format.
//!
//! A small HTTP/1.1 server: one request per connection (`Connection: close`), `GET` or `HEAD` of
//! `/metrics` (a query string is ignored); any other path is 404, any other method 405, a request
//! that is not HTTP, too long (8 KiB) or too slow (5 s) is answered 400 or dropped. Before each
//! answer a refresh sets the metrics read at scrape time (a queue's depth). At most
//! [`CONNECTIONS`] connections are served at once, each for at most [`CONNECTION_LIMIT`]; more wait
//! in the listen backlog, so a flood of idle connections costs neither descriptors nor tasks.

use crate::exit::Failure;
use crate::store;
use leasehold::Locks;
use prometheus::Registry;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The longest request head read.
const MOST: usize = 8 * 1024;

/// How long a client may take to send its request.
const READ_LIMIT: Duration = Duration::from_secs(5);

/// How long one connection may last in all, its answer included (a client that does not read).
const CONNECTION_LIMIT: Duration = Duration::from_secs(10);

/// The most connections served at once.
const CONNECTIONS: usize = 16;

/// What `--metrics ADDR` asks for: the address, and the registry served there.
pub(crate) struct Endpoint {
    addr: SocketAddr,
    pub(crate) registry: Registry,
}

impl Endpoint {
    /// The endpoint of `--metrics ADDR`, if given, with an empty registry.
    pub(crate) fn given(addr: Option<SocketAddr>) -> Option<Endpoint> {
        addr.map(|addr| Endpoint {
            addr,
            registry: Registry::new(),
        })
    }

    /// Serves the registry ([`serve`]), running `refresh` before each answer.
    pub(crate) async fn serve<F, Fut>(self, refresh: F) -> Result<(), Failure>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        serve(self.addr, self.registry, refresh).await
    }

    /// [`Endpoint::serve`] when given, with nothing read at scrape time.
    pub(crate) async fn serve_given(endpoint: Option<Endpoint>) -> Result<(), Failure> {
        match endpoint {
            Some(e) => e.serve(|| async {}).await,
            None => Ok(()),
        }
    }
}

/// `Locks` over the store at `store_url` (the default store without one); with an `endpoint`, its
/// lease metrics (`leasehold_acquire_…`, `leasehold_lost_total` …) are recorded in its registry.
pub(crate) async fn locks(
    store_url: Option<&str>,
    endpoint: Option<&Endpoint>,
) -> Result<Locks, Failure> {
    let locks = Locks::from_arc(store::open(store_url).await?);
    match endpoint {
        Some(e) => Ok(locks.with_metrics(
            leasehold::Metrics::register("leasehold", &e.registry).map_err(setup_failed)?,
        )),
        None => Ok(locks),
    }
}

/// A metric that could not be registered.
pub(crate) fn setup_failed(e: impl std::fmt::Display) -> Failure {
    Failure::error(format!("cannot set up the metrics: {e}"))
}

/// Listens on `addr` (bound before this returns, so that a taken port fails the command) and
/// serves `registry` in the background, running `refresh` before each answer.
async fn serve<F, Fut>(addr: SocketAddr, registry: Registry, refresh: F) -> Result<(), Failure>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::error(format!("cannot serve metrics on {addr}: {e}")))?;
    tracing::info!(addr = %addr, "serving metrics at /metrics");
    let shared = Arc::new((registry, refresh));
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    tokio::spawn(async move {
        loop {
            // A free slot first: connections beyond it wait in the backlog, not in this process.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((conn, _)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let (registry, refresh) = &*shared;
                        let answered =
                            tokio::time::timeout(CONNECTION_LIMIT, answer(conn, registry, refresh));
                        match answered.await {
                            Ok(Err(e)) => tracing::debug!(error = %e, "metrics request failed"),
                            Err(_) => tracing::debug!("metrics connection ran out of time"),
                            Ok(Ok(())) => {}
                        }
                        drop(slot);
                    });
                }
                Err(e) => {
                    // Out of descriptors, say: a pause, not a busy loop.
                    tracing::warn!(error = %e, "cannot accept a metrics connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

/// Reads one request from `conn` and answers it.
async fn answer<F, Fut>(
    mut conn: TcpStream,
    registry: &Registry,
    refresh: &F,
) -> std::io::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let head = match tokio::time::timeout(READ_LIMIT, read_head(&mut conn)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let (status, body) = match route(head.as_deref()) {
        Route::Metrics { head_only } => {
            refresh().await;
            let text = leasehold::Metrics::render(registry);
            (
                "200 OK",
                if head_only {
                    (text.len(), None)
                } else {
                    (text.len(), Some(text))
                },
            )
        }
        Route::Status(status) => (status, (status.len() + 1, Some(format!("{status}\n")))),
    };
    let (length, text) = body;
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    if let Some(text) = text {
        out.push_str(&text);
    }
    conn.write_all(out.as_bytes()).await?;
    conn.shutdown().await
}

/// The request head (up to the blank line), or `None` when it is too long or the connection
/// ended first.
async fn read_head(conn: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(String::from_utf8(buf).ok());
        }
        if buf.len() > MOST {
            return Ok(None);
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    Status(&'static str),
}

/// Routes a request by its head (`None`: unreadable).
fn route(head: Option<&str>) -> Route {
    let Some(line) = head.and_then(|h| h.lines().next()) else {
        return Route::Status("400 Bad Request");
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::Status("400 Bad Request");
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Status("400 Bad Request");
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => Route::Metrics {
            head_only: method == "HEAD",
        },
        (_, "/metrics") => Route::Status("405 Method Not Allowed"),
        _ => Route::Status("404 Not Found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_routed_by_method_and_path() {
        let r = |s: &str| route(Some(s));
        assert_eq!(
            r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            r("HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(
            r("POST /metrics HTTP/1.1\r\n\r\n"),
            Route::Status("405 Method Not Allowed")
        );
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Route::Status("404 Not Found"));
        assert_eq!(r("garbage\r\n\r\n"), Route::Status("400 Bad Request"));
        assert_eq!(
            r("GET /metrics SPDY\r\n\r\n"),
            Route::Status("400 Bad Request")
        );
        assert_eq!(route(None), Route::Status("400 Bad Request"));
    }
}
