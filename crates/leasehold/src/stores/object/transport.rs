//! The HTTP client the object stores (S3, Azure, GCS) share: one pooled `hyper` client
//! (HTTP/1.1; TLS by rustls with the `ring` provider and the system's root certificates), a
//! timeout on every request, response bodies read up to a limit, a count of the requests sent,
//! and one mapping of a refused answer to an [`Error`].

use crate::error::{Error, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{HeaderMap, Request};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A request body.
pub(crate) type Body = Full<Bytes>;

/// What a server answered.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The HTTP status.
    pub(crate) status: u16,
    /// The headers.
    pub(crate) headers: HeaderMap,
    /// The body, up to the limit the request was sent with.
    pub(crate) body: Bytes,
    /// The body was longer than the limit (and [`body`](Self::body) is empty).
    pub(crate) too_long: bool,
}

impl Answer {
    /// Header `name`, if it is there and text.
    pub(crate) fn header(&self, name: impl hyper::header::AsHeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `ETag` header, as the server wrote it (quotes included).
    #[cfg_attr(not(any(feature = "s3", feature = "azure")), allow(dead_code))] // the signers' and S3/Azure's only
    pub(crate) fn etag(&self) -> Option<String> {
        self.header(hyper::header::ETAG).map(str::to_owned)
    }

    /// The answer's age of the object ([`server_age`]: its `Date` less the
    /// object's `Last-Modified`).
    pub(crate) fn server_age(&self) -> Option<Duration> {
        server_age(
            self.header(hyper::header::DATE),
            self.header(hyper::header::LAST_MODIFIED),
        )
    }

    /// The answer says the bucket or container is not there (S3's `NoSuchBucket`, Azure's
    /// `ContainerNotFound`, GCS's "bucket does not exist").
    pub(crate) fn no_bucket(&self) -> bool {
        let text = String::from_utf8_lossy(&self.body);
        text.contains("NoSuchBucket")
            || text.contains("ContainerNotFound")
            || text.contains("bucket does not exist")
    }

    /// What the server said: a JSON error's `error.message` (GCS), else the body's beginning.
    fn message(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| self.excerpt())
    }

    /// The error for an answer that is neither success nor a lost race: access denied (401,
    /// 403, with `denied_hint`: what the credentials most likely lack) and other refusals are
    /// [`Error::Store`], not retryable; 408, 429 and 5xx are [`Error::Unavailable`].
    pub(crate) fn refused(&self, store: &str, what: &str, denied_hint: &str) -> Error {
        let store = store.to_owned();
        let detail = if self.no_bucket() {
            format!(
                "{what}: the bucket or container does not exist (HTTP {}); create it first",
                self.status
            )
        } else {
            format!("{what}: HTTP {} {}", self.status, self.message())
        };
        match self.status {
            401 | 403 => Error::Store {
                store,
                detail: format!("{detail} (access denied: {denied_hint})"),
                retryable: false,
                source: None,
            },
            408 | 429 | 500..=599 => Error::Unavailable {
                store,
                detail,
                source: None,
            },
            _ => Error::Store {
                store,
                detail,
                retryable: false,
                source: None,
            },
        }
    }

    /// The beginning of the body, for messages.
    pub(crate) fn excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        match text.char_indices().nth(300) {
            Some((i, _)) => format!("{}…", &text[..i]),
            None => text.to_owned(),
        }
    }
}

/// A pooled HTTP(S) client with a per-request timeout.
pub(crate) struct Http {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    timeout: Duration,
    requests: AtomicU64,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Http {
    /// A client whose requests each get `timeout` to be answered in full.
    ///
    /// # Errors
    /// [`Error::Store`] when TLS cannot be set up (no usable root certificate at all).
    pub(crate) fn new(store: &str, timeout: Duration) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            // A certificate the system lists but rustls cannot use is skipped, as browsers do.
            let _ = roots.add(cert);
        }
        let fail = |detail: String| Error::Store {
            store: store.to_owned(),
            detail,
            retryable: false,
            source: None,
        };
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        // Requests are small and answered at once: no Nagle delay between their pieces.
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(Http {
            client,
            timeout,
            requests: AtomicU64::new(0),
        })
    }

    /// Requests sent so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Sends `req` and reads the answer's body up to `limit` bytes, all within the timeout.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached, the connection breaks or no full
    /// answer comes within the timeout (`what` names the request in the message).
    pub(crate) async fn send(
        &self,
        store: &str,
        what: &str,
        req: Request<Body>,
        limit: usize,
    ) -> Result<Answer> {
        let unavailable =
            |detail: String, source: Option<crate::error::Source>| Error::Unavailable {
                store: store.to_owned(),
                detail,
                source,
            };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let call = async {
            let res = self.client.request(req).await.map_err(|e| {
                let detail = format!("{what}: {e}");
                unavailable(detail, Some(Arc::new(e)))
            })?;
            let (parts, body) = res.into_parts();
            let (body, too_long) = match Limited::new(body, limit).collect().await {
                Ok(b) => (b.to_bytes(), false),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => (Bytes::new(), true),
                Err(e) => {
                    return Err(unavailable(
                        format!("{what}: reading the answer: {e}"),
                        None,
                    ))
                }
            };
            Ok(Answer {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
                too_long,
            })
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(answer) => answer,
            Err(_) => Err(Error::no_answer(store)),
        }
    }
}

/// How long, at least, an object had gone unwritten when the server answered, by the server's
/// clock: its `Date` header less its `Last-Modified` one, less one second for each header's
/// resolution (both are whole seconds: the answer came at or after `Date`, the write before
/// `Last-Modified` + 1 s). `None` when either is missing or unreadable.
///
/// Both times are the server's (the same service, in practice the same fleet of clocks); no
/// client's clock enters.
pub(crate) fn server_age(
    date: Option<&str>,
    modified: Option<&str>,
) -> Option<std::time::Duration> {
    let date = httpdate::parse_http_date(date?.trim()).ok()?;
    let modified = httpdate::parse_http_date(modified?.trim()).ok()?;
    let age = date.duration_since(modified).ok()?;
    Some(age.saturating_sub(std::time::Duration::from_secs(1)))
}

#[cfg(test)]
mod server_age_tests {
    use super::server_age;
    use std::time::Duration;

    #[test]
    fn the_age_is_a_lower_bound_in_whole_seconds() {
        let at = |t: &str| format!("Thu, 26 Nov 2026 17:{t} GMT");
        assert_eq!(
            server_age(Some(&at("10:49")), Some(&at("10:47"))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            server_age(Some(&at("10:47")), Some(&at("10:47"))),
            Some(Duration::ZERO)
        );
        // A Last-Modified after the Date (another front end's clock): no age to trust.
        assert_eq!(server_age(Some(&at("10:47")), Some(&at("10:49"))), None);
        assert_eq!(server_age(None, Some(&at("10:47"))), None);
        assert_eq!(server_age(Some("yesterday"), Some(&at("10:47"))), None);
    }
}
