//! The HTTP client the object stores share: one pooled `hyper` client (HTTP/1.1; TLS by rustls
//! with the `ring` provider and the system's root certificates), a timeout on every request, and
//! response bodies read up to a limit.

use crate::error::{Error, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{HeaderMap, Request};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
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
    /// The `ETag` header, as the server wrote it (quotes included).
    pub(crate) fn etag(&self) -> Option<String> {
        self.headers
            .get(hyper::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
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
#[derive(Clone)]
pub(crate) struct Http {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    timeout: Duration,
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
        Ok(Http { client, timeout })
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
