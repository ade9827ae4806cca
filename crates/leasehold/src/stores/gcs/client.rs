//! A thin client of the Cloud Storage **JSON API** over `reqwest`: the four calls the store makes
//! (media download, multipart upload with `ifGenerationMatch`, delete with `ifGenerationMatch`,
//! list), each under the store's timeout, with a bearer token from `gcp_auth` unless it talks to
//! an emulator.

use crate::error::{Error, Result};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Everything but RFC 3986's unreserved characters is escaped in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The OAuth scope the store asks for: read and write objects.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";

/// How requests are authorised.
#[derive(Clone)]
pub(super) enum Auth {
    /// No credentials (an emulator).
    Anonymous,
    /// Bearer tokens from Google's credential chain (cached and refreshed by `gcp_auth`).
    Google(Arc<dyn gcp_auth::TokenProvider>),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Auth::Anonymous => "Anonymous",
            Auth::Google(_) => "Google(<token provider>)",
        })
    }
}

/// What a read found.
#[derive(Debug)]
pub(super) enum Read {
    /// No such object.
    Missing,
    /// The object's bytes and generation.
    Found(Vec<u8>, String),
    /// The object is larger than the read limit (its generation).
    TooLarge(String, u64),
}

/// The JSON API client of one bucket.
#[derive(Debug)]
pub(super) struct Client {
    http: reqwest::Client,
    /// `https://storage.googleapis.com` or the emulator's base URL, without a trailing `/`.
    endpoint: String,
    bucket: String,
    auth: Auth,
    /// For messages: the store's description.
    describe: String,
    read_limit: u64,
    requests: AtomicU64,
}

impl Client {
    pub(super) fn new(
        endpoint: String,
        bucket: String,
        auth: Auth,
        timeout: Duration,
        read_limit: u64,
        describe: String,
    ) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| Error::Unavailable {
                detail: format!("cannot build an HTTP client: {e}"),
                store: describe.clone(),
                source: Some(Arc::new(e)),
            })?;
        Ok(Client {
            http,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            bucket,
            auth,
            describe,
            read_limit,
            requests: AtomicU64::new(0),
        })
    }

    /// Requests sent so far.
    pub(super) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn object_url(&self, name: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.endpoint,
            utf8_percent_encode(&self.bucket, SEGMENT),
            utf8_percent_encode(name, SEGMENT)
        )
    }

    async fn send(&self, what: &str, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let req = match &self.auth {
            Auth::Anonymous => req,
            Auth::Google(p) => {
                let token = p.token(&[SCOPE]).await.map_err(|e| Error::Store {
                    detail: format!(
                        "{what}: no access token from the Google credential chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default credentials, the metadata server): {e}"
                    ),
                    store: self.describe.clone(),
                    retryable: true,
                    source: None,
                })?;
                req.bearer_auth(token.as_str())
            }
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        req.send().await.map_err(|e| {
            let e = e.without_url();
            Error::Unavailable {
                detail: format!("{what}: {e}"),
                store: self.describe.clone(),
                source: Some(Arc::new(e)),
            }
        })
    }

    /// The error of an answer with an unexpected status.
    async fn failed(&self, what: &str, resp: reqwest::Response) -> Error {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| body.chars().take(200).collect());
        let store = self.describe.clone();
        let code = status.as_u16();
        match code {
            429 | 408 | 500..=599 => Error::Unavailable {
                detail: format!("{what}: {status}: {message}"),
                store,
                source: None,
            },
            401 => Error::Store {
                detail: format!("{what}: {status}: the credentials were refused: {message}"),
                store,
                retryable: false,
                source: None,
            },
            403 => Error::Store {
                detail: format!(
                    "{what}: {status}: {message}. The identity needs storage.objects.get, create, delete and list on bucket {} (the role roles/storage.objectUser grants them)",
                    self.bucket
                ),
                store,
                retryable: false,
                source: None,
            },
            _ => Error::Store {
                detail: format!("{what}: {status}: {message}"),
                store,
                retryable: false,
                source: None,
            },
        }
    }

    /// Reads object `name` (its bytes, up to the read limit) and its generation, with its server
    /// age ([`crate::stores::server_age`]: the answer's `Date` less the object's `Last-Modified`).
    pub(super) async fn get(&self, name: &str) -> Result<(Read, Option<std::time::Duration>)> {
        let what = format!("read gs://{}/{name}", self.bucket);
        let req = self
            .http
            .get(self.object_url(name))
            .query(&[("alt", "media")]);
        let mut resp = self.send(&what, req).await?;
        let header = |h| resp.headers().get(h).and_then(|v| v.to_str().ok());
        let age = crate::stores::server_age(
            header(reqwest::header::DATE),
            header(reqwest::header::LAST_MODIFIED),
        );
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok((Read::Missing, None));
        }
        if !resp.status().is_success() {
            return Err(self.failed(&what, resp).await);
        }
        let generation = resp
            .headers()
            .get("x-goog-generation")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| Error::Store {
                detail: format!("{what}: the answer has no x-goog-generation header"),
                store: self.describe.clone(),
                retryable: false,
                source: None,
            })?;
        if let Some(n) = resp.content_length().filter(|n| *n > self.read_limit) {
            return Ok((Read::TooLarge(generation, n), age));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| Error::Unavailable {
            detail: format!("{what}: {}", e.without_url()),
            store: self.describe.clone(),
            source: None,
        })? {
            body.extend_from_slice(&chunk);
            if body.len() as u64 > self.read_limit {
                return Ok((Read::TooLarge(generation, body.len() as u64), age));
            }
        }
        Ok((Read::Found(body, generation), age))
    }

    /// Writes object `name` if its generation is still `generation` (`"0"`: if there is no such
    /// object), as one multipart upload. The new generation, or `None` when the precondition
    /// failed (412) or the object is gone (404 on a replace).
    pub(super) async fn put(
        &self,
        name: &str,
        body: &[u8],
        generation: &str,
    ) -> Result<Option<String>> {
        let what = format!("write gs://{}/{name}", self.bucket);
        let boundary = format!("leasehold-{:016x}", fastrand::u64(..));
        let meta = serde_json::json!({
            "name": name,
            "contentType": "application/json",
            "cacheControl": "no-store",
        });
        let mut payload = Vec::with_capacity(body.len() + 512);
        payload.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n"
            )
            .as_bytes(),
        );
        payload.extend_from_slice(body);
        payload.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let url = format!(
            "{}/upload/storage/v1/b/{}/o",
            self.endpoint,
            utf8_percent_encode(&self.bucket, SEGMENT)
        );
        let req = self
            .http
            .post(url)
            .query(&[
                ("uploadType", "multipart"),
                ("ifGenerationMatch", generation),
                ("fields", "generation"),
            ])
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/related; boundary={boundary}"),
            )
            .body(payload);
        let resp = self.send(&what, req).await?;
        match resp.status().as_u16() {
            412 => return Ok(None),
            404 if generation != "0" => return Ok(None),
            _ => {}
        }
        if !resp.status().is_success() {
            return Err(self.failed(&what, resp).await);
        }
        let body = resp.bytes().await.map_err(|e| Error::Unavailable {
            detail: format!("{what}: {}", e.without_url()),
            store: self.describe.clone(),
            source: None,
        })?;
        let generation = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| match &v["generation"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .ok_or_else(|| Error::Store {
                detail: format!("{what}: the answer carries no generation"),
                store: self.describe.clone(),
                retryable: false,
                source: None,
            })?;
        Ok(Some(generation))
    }

    /// Deletes object `name` if its generation is still `generation`; `false` when it is not
    /// (412) or the object is gone (404).
    pub(super) async fn delete(&self, name: &str, generation: &str) -> Result<bool> {
        let what = format!("delete gs://{}/{name}", self.bucket);
        let req = self
            .http
            .delete(self.object_url(name))
            .query(&[("ifGenerationMatch", generation)]);
        let resp = self.send(&what, req).await?;
        match resp.status().as_u16() {
            200..=299 => Ok(true),
            404 | 412 => Ok(false),
            _ => Err(self.failed(&what, resp).await),
        }
    }

    /// The names of the objects whose names start with `prefix`, every page.
    pub(super) async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let what = format!("list gs://{}/{prefix}", self.bucket);
        let url = format!(
            "{}/storage/v1/b/{}/o",
            self.endpoint,
            utf8_percent_encode(&self.bucket, SEGMENT)
        );
        let mut names = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut query = vec![
                ("prefix", prefix.to_owned()),
                ("fields", "items(name),nextPageToken".to_owned()),
            ];
            if let Some(p) = &page {
                query.push(("pageToken", p.clone()));
            }
            let resp = self.send(&what, self.http.get(&url).query(&query)).await?;
            if !resp.status().is_success() {
                return Err(self.failed(&what, resp).await);
            }
            let v = json_value(resp, &what, &self.describe).await?;
            if let Some(items) = v["items"].as_array() {
                names.extend(
                    items
                        .iter()
                        .filter_map(|i| i["name"].as_str().map(str::to_owned)),
                );
            }
            match v["nextPageToken"].as_str() {
                Some(p) if !p.is_empty() => page = Some(p.to_owned()),
                _ => return Ok(names),
            }
        }
    }
}

/// A response body read as JSON.
async fn json_value(resp: reqwest::Response, what: &str, store: &str) -> Result<serde_json::Value> {
    let body = resp.bytes().await.map_err(|e| Error::Unavailable {
        detail: format!("{what}: {}", e.without_url()),
        store: store.to_owned(),
        source: None,
    })?;
    serde_json::from_slice(&body).map_err(|e| Error::Store {
        detail: format!("{what}: the answer is not JSON: {e}"),
        store: store.to_owned(),
        retryable: false,
        source: None,
    })
}
