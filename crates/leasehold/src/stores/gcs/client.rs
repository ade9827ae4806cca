//! A thin client of the Cloud Storage **JSON API** over the object stores' shared transport
//! ([`crate::stores::object::transport`]): the four calls the store makes (media download,
//! multipart upload with `ifGenerationMatch`, delete with `ifGenerationMatch`, list), each under
//! the store's timeout, signed with a bearer token from `gcp_auth` unless it talks to an
//! emulator.

use crate::error::{Error, Result};
use crate::stores::object::sign::{uri_encode, ToSign};
use crate::stores::object::transport::{Answer, Http};
use crate::stores::object::{LISTING_BYTES, MAX_RECORD_BYTES, SHORT_ANSWER_BYTES};
use hyper::body::Bytes;
use hyper::Method;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The OAuth scope the store asks for: read and write objects.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";

/// What a refused request most likely lacks.
const DENIED_HINT: &str = "the identity needs storage.objects.get, create, delete and list on the bucket (the role roles/storage.objectUser grants them)";

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
    /// The object is larger than [`MAX_RECORD_BYTES`] (its generation and size).
    TooLarge(String, u64),
}

/// The JSON API client of one bucket.
#[derive(Debug)]
pub(super) struct Client {
    http: Http,
    /// `https://storage.googleapis.com` or the emulator's base URL, without a trailing `/`.
    endpoint: String,
    bucket: String,
    auth: Auth,
    /// For messages: the store's description.
    describe: String,
}

impl Client {
    pub(super) fn new(
        endpoint: String,
        bucket: String,
        auth: Auth,
        timeout: Duration,
        describe: String,
    ) -> Result<Self> {
        Ok(Client {
            http: Http::new(&describe, timeout)?,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            bucket,
            auth,
            describe,
        })
    }

    /// Requests sent so far.
    pub(super) fn requests(&self) -> u64 {
        self.http.requests()
    }

    /// The path of the bucket's objects (`upload`: the upload endpoint's).
    fn objects_path(&self, upload: bool) -> String {
        let base = if upload { "/upload" } else { "" };
        format!("{base}/storage/v1/b/{}/o", uri_encode(&self.bucket, false))
    }

    /// The path of object `name`.
    fn object_path(&self, name: &str) -> String {
        format!("{}/{}", self.objects_path(false), uri_encode(name, false))
    }

    /// Sends `r` with a bearer token (unless anonymous), reading up to `limit` bytes.
    async fn send(&self, what: &str, r: ToSign, limit: usize) -> Result<Answer> {
        let auth = match &self.auth {
            Auth::Anonymous => None,
            Auth::Google(p) => {
                let token = p.token(&[SCOPE]).await.map_err(|e| Error::Store {
                    detail: format!(
                        "{what}: no access token from the Google credential chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default credentials, the metadata server): {e}"
                    ),
                    store: self.describe.clone(),
                    retryable: true,
                    source: None,
                })?;
                Some(format!("Bearer {}", token.as_str()))
            }
        };
        let req = r.into_request(&self.endpoint, auth, &self.describe)?;
        self.http.send(&self.describe, what, req, limit).await
    }

    /// The error of an answer with an unexpected status.
    fn refused(&self, what: &str, a: &Answer) -> Error {
        a.refused(&self.describe, what, DENIED_HINT)
    }

    /// Reads object `name` (its bytes, up to [`MAX_RECORD_BYTES`]) and its generation, with its server
    /// age ([`server_age`](crate::stores::object::transport::server_age): the answer's `Date` less the object's `Last-Modified`).
    pub(super) async fn get(&self, name: &str) -> Result<(Read, Option<Duration>)> {
        let what = format!("read gs://{}/{name}", self.bucket);
        let mut r = ToSign::new(Method::GET, self.object_path(name));
        r.query = vec![("alt", "media".to_owned())];
        let a = self.send(&what, r, MAX_RECORD_BYTES).await?;
        let age = a.server_age();
        if a.status == 404 {
            return Ok((Read::Missing, None));
        }
        if !(200..300).contains(&a.status) {
            return Err(self.refused(&what, &a));
        }
        let generation = a
            .header("x-goog-generation")
            .map(str::to_owned)
            .ok_or_else(|| Error::Store {
                detail: format!("{what}: the answer has no x-goog-generation header"),
                store: self.describe.clone(),
                retryable: false,
                source: None,
            })?;
        if a.too_long {
            let size = a
                .header(hyper::header::CONTENT_LENGTH)
                .and_then(|n| n.parse().ok())
                .unwrap_or(MAX_RECORD_BYTES as u64 + 1);
            return Ok((Read::TooLarge(generation, size), age));
        }
        Ok((Read::Found(a.body.to_vec(), generation), age))
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
        let mut r = ToSign::new(Method::POST, self.objects_path(true));
        r.query = vec![
            ("uploadType", "multipart".to_owned()),
            ("ifGenerationMatch", generation.to_owned()),
            ("fields", "generation".to_owned()),
        ];
        r.headers = vec![(
            "content-type".to_owned(),
            format!("multipart/related; boundary={boundary}"),
        )];
        r.body = Bytes::from(payload);
        let a = self.send(&what, r, SHORT_ANSWER_BYTES).await?;
        match a.status {
            412 => return Ok(None),
            404 if generation != "0" && !a.no_bucket() => return Ok(None),
            200..=299 => {}
            _ => return Err(self.refused(&what, &a)),
        }
        serde_json::from_slice::<serde_json::Value>(&a.body)
            .ok()
            .and_then(|v| match &v["generation"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .map(Some)
            .ok_or_else(|| Error::Store {
                detail: format!("{what}: the answer carries no generation"),
                store: self.describe.clone(),
                retryable: false,
                source: None,
            })
    }

    /// Deletes object `name` if its generation is still `generation`; `false` when it is not
    /// (412) or the object is gone (404).
    pub(super) async fn delete(&self, name: &str, generation: &str) -> Result<bool> {
        let what = format!("delete gs://{}/{name}", self.bucket);
        let mut r = ToSign::new(Method::DELETE, self.object_path(name));
        r.query = vec![("ifGenerationMatch", generation.to_owned())];
        let a = self.send(&what, r, SHORT_ANSWER_BYTES).await?;
        match a.status {
            200..=299 => Ok(true),
            404 | 412 => Ok(false),
            _ => Err(self.refused(&what, &a)),
        }
    }

    /// The names of the objects whose names start with `prefix`, every page.
    pub(super) async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let what = format!("list gs://{}/{prefix}", self.bucket);
        let mut names = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut r = ToSign::new(Method::GET, self.objects_path(false));
            r.query = vec![
                ("prefix", prefix.to_owned()),
                ("fields", "items(name),nextPageToken".to_owned()),
            ];
            if let Some(p) = &page {
                r.query.push(("pageToken", p.clone()));
            }
            let a = self.send(&what, r, LISTING_BYTES).await?;
            if !(200..300).contains(&a.status) || a.too_long {
                return Err(self.refused(&what, &a));
            }
            let v: serde_json::Value =
                serde_json::from_slice(&a.body).map_err(|e| Error::Store {
                    detail: format!("{what}: the answer is not JSON: {e}"),
                    store: self.describe.clone(),
                    retryable: false,
                    source: None,
                })?;
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
