//! The S3 and Azure stores' common part: one JSON object per key over a [`Backend`] (addressing,
//! signing, listing format), conditional writes and their answers, and listing.

use super::transport::{Answer, Body, Http};
use super::{LISTING_BYTES, MAX_RECORD_BYTES, SHORT_ANSWER_BYTES};
use crate::error::{Error, Result};
use crate::key::{Key, Naming};
use crate::record::LeaseRecord;
use crate::store::{Capabilities, Stored};
use hyper::body::Bytes;
use hyper::{Method, Request};
use std::time::Duration;

/// The precondition of a raw write (tests and benchmark floors only: hidden from the docs, no
/// API).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition<'a> {
    /// `If-None-Match: *`: only if there is no object.
    Absent,
    /// `If-Match: ETAG`: only if the object's ETag is still this one.
    Matches(&'a str),
}

/// What the server answered a raw request ([`Precondition`]), as it said it (tests and benchmark
/// floors only: hidden from the docs, no API).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawAnswer {
    /// The HTTP status: 200 or 201 for a write done, 204 (or 202, 200) for a delete done, 412 for
    /// a failed precondition (Azure: 409 for a create that finds the blob).
    pub status: u16,
    /// The new ETag, for a write done.
    pub etag: Option<String>,
}

/// One request a [`Backend`] turns into a signed HTTP request.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) method: Method,
    /// The object's name, or `None` for a request on the bucket or container (a listing).
    pub(crate) object: Option<String>,
    /// Query parameters, not encoded.
    pub(crate) query: Vec<(&'static str, String)>,
    /// Extra headers (lower-case names).
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Bytes,
}

/// One page of a listing: object names and the token of the next page.
#[derive(Debug, Default)]
pub(crate) struct Page {
    pub(crate) names: Vec<String>,
    pub(crate) next: Option<String>,
}

/// What differs between the object stores.
pub(crate) trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// The store's description (no secret).
    fn describe(&self) -> &str;
    /// The signed HTTP request for `call`.
    fn request(&self, call: Call) -> Result<Request<Body>>;
    /// Extra headers of every object write (Azure's blob type).
    fn put_headers(&self) -> Vec<(&'static str, String)>;
    /// The query of one listing page of names starting with `prefix`.
    fn list_query(&self, prefix: &str, next: Option<&str>) -> Vec<(&'static str, String)>;
    /// One listing page from the server's XML.
    fn parse_list(&self, xml: &str) -> Page;
    /// What a refused request (401, 403) most likely lacks.
    fn denied_hint(&self) -> &'static str;
}

/// A [`crate::store::RecordStore`] of one JSON object per key, over a [`Backend`].
#[derive(Debug)]
pub(crate) struct Objects<B> {
    pub(crate) backend: B,
    http: Http,
    /// Object names start with this (empty, or ending with `/`).
    prefix: String,
    naming: Naming,
}

/// 128 random bits in hex: what makes every write's bytes, and so its ETag, new.
fn nonce() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The object of `record`: its JSON form and a fresh `write` nonce.
///
/// # Errors
/// [`Error::InvalidOption`] (`labels`) when it would pass [`MAX_RECORD_BYTES`].
pub(crate) fn encode(record: &LeaseRecord) -> Result<Bytes> {
    let mut value = serde_json::to_value(record).map_err(|e| Error::Corrupt {
        key: record.key.clone(),
        detail: format!("cannot encode the record: {e}"),
    })?;
    if let Some(map) = value.as_object_mut() {
        map.insert("write".into(), nonce().into());
    }
    let bytes = serde_json::to_vec_pretty(&value).map_err(|e| Error::Corrupt {
        key: record.key.clone(),
        detail: format!("cannot encode the record: {e}"),
    })?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(Error::InvalidOption {
            name: "labels",
            reason: format!(
                "the record of {} would be {} bytes, above the {MAX_RECORD_BYTES} bytes (1 MiB) an object store's record may have: use fewer or shorter labels",
                crate::key::display_key(&record.key),
                bytes.len()
            ),
        });
    }
    Ok(Bytes::from(bytes))
}

/// The record an object holds, or why it cannot be read.
pub(crate) fn decode(bytes: &[u8], version: String) -> Stored {
    match serde_json::from_slice::<LeaseRecord>(bytes) {
        Ok(record) => Stored::Record { record, version },
        Err(e) => Stored::Corrupt {
            version,
            detail: format!("the object is not a leasehold record: {e}"),
            salvaged_fence: crate::decide::salvage_fence(bytes),
        },
    }
}

/// The text of every `<tag>…</tag>` in `xml`, unescaped (the listings' XML is flat enough).
pub(crate) fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(xml_unescape(&after[..end]));
        rest = &after[end + close.len()..];
    }
    out
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

impl<B: Backend> Objects<B> {
    /// The store over `backend`, naming objects `prefix` + name (a `/` is added to a prefix
    /// that lacks it), each request answered within `timeout`.
    pub(crate) fn new(backend: B, prefix: &str, timeout: Duration) -> Result<Self> {
        let prefix = match prefix.trim_start_matches('/') {
            "" => String::new(),
            p if p.ends_with('/') => p.to_owned(),
            p => format!("{p}/"),
        };
        Ok(Objects {
            http: Http::new(backend.describe(), timeout)?,
            backend,
            prefix,
            naming: Naming::file(),
        })
    }

    /// The object name of `key`.
    pub(crate) fn object_name(&self, key: &Key) -> String {
        format!("{}{}.json", self.prefix, self.naming.name(key))
    }

    /// The prefix of every object name.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) async fn send(&self, what: &str, call: Call, limit: usize) -> Result<Answer> {
        let req = self.backend.request(call)?;
        self.http
            .send(self.backend.describe(), what, req, limit)
            .await
    }

    /// The error for an answer that is neither success nor a lost race.
    pub(crate) fn refused(&self, what: &str, a: &Answer) -> Error {
        a.refused(self.backend.describe(), what, self.backend.denied_hint())
    }

    /// Requests sent so far.
    pub(crate) fn requests(&self) -> u64 {
        self.http.requests()
    }

    /// Writes `body` to object `name` if `pre` holds; the server's answer as it is (a failed
    /// precondition is an answer, not an error).
    pub(crate) async fn put_raw(
        &self,
        name: &str,
        body: Bytes,
        pre: Precondition<'_>,
    ) -> Result<RawAnswer> {
        let mut headers = self.backend.put_headers();
        headers.push(("content-type", "application/json".into()));
        headers.push(match pre {
            Precondition::Absent => ("if-none-match", "*".into()),
            Precondition::Matches(etag) => ("if-match", etag.to_owned()),
        });
        let call = Call {
            method: Method::PUT,
            object: Some(name.to_owned()),
            query: vec![],
            headers,
            body,
        };
        let what = format!("write {name}");
        let a = self.send(&what, call, SHORT_ANSWER_BYTES).await?;
        match a.status {
            200 | 201 => match a.etag() {
                Some(etag) => Ok(RawAnswer {
                    status: a.status,
                    etag: Some(etag),
                }),
                None => Err(Error::Store {
                    store: self.backend.describe().to_owned(),
                    detail: format!("{what}: the server answered {} without an ETag", a.status),
                    retryable: false,
                    source: None,
                }),
            },
            404 | 409 | 412 => Ok(RawAnswer {
                status: a.status,
                etag: None,
            }),
            _ => Err(self.refused(&what, &a)),
        }
    }

    /// Deletes object `name` if its ETag is still `etag`; the server's answer as it is.
    pub(crate) async fn delete_raw(&self, name: &str, etag: &str) -> Result<RawAnswer> {
        let call = Call {
            method: Method::DELETE,
            object: Some(name.to_owned()),
            query: vec![],
            headers: vec![("if-match", etag.to_owned())],
            body: Bytes::new(),
        };
        let what = format!("delete {name}");
        let a = self.send(&what, call, SHORT_ANSWER_BYTES).await?;
        match a.status {
            200 | 202 | 204 | 404 | 409 | 412 => Ok(RawAnswer {
                status: a.status,
                etag: None,
            }),
            _ => Err(self.refused(&what, &a)),
        }
    }

    /// Object `name`'s bytes and ETag, `None` if there is no such object; `Ok(Err(etag))` when it
    /// is larger than [`MAX_RECORD_BYTES`]. With its server age ([`server_age`](crate::stores::object::transport::server_age)).
    pub(crate) async fn get_raw(
        &self,
        name: &str,
    ) -> Result<(
        Option<std::result::Result<(Bytes, String), String>>,
        Option<Duration>,
    )> {
        let call = Call {
            method: Method::GET,
            object: Some(name.to_owned()),
            query: vec![],
            headers: vec![],
            body: Bytes::new(),
        };
        let what = format!("read {name}");
        let a = self.send(&what, call, MAX_RECORD_BYTES).await?;
        let age = a.server_age();
        match a.status {
            200 => {
                let etag = a.etag().ok_or_else(|| Error::Store {
                    store: self.backend.describe().to_owned(),
                    detail: format!("{what}: the server answered without an ETag"),
                    retryable: false,
                    source: None,
                })?;
                let got = if a.too_long {
                    Err(etag)
                } else {
                    Ok((a.body, etag))
                };
                Ok((Some(got), age))
            }
            404 if !a.no_bucket() => Ok((None, None)),
            _ => Err(self.refused(&what, &a)),
        }
    }

    /// The names of every object under the prefix, in the server's (lexical) order.
    async fn list_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let call = Call {
                method: Method::GET,
                object: None,
                query: self.backend.list_query(&self.prefix, next.as_deref()),
                headers: vec![],
                body: Bytes::new(),
            };
            let a = self.send("list", call, LISTING_BYTES).await?;
            if a.status != 200 || a.too_long {
                return Err(self.refused("list", &a));
            }
            let page = self.backend.parse_list(&String::from_utf8_lossy(&a.body));
            names.extend(page.names);
            match page.next {
                Some(n) if !n.is_empty() => next = Some(n),
                _ => return Ok(names),
            }
        }
    }

    /// The record of `name` as stored, and its server age.
    async fn read(&self, name: &str) -> Result<Option<(Stored, Option<Duration>)>> {
        let (got, age) = self.get_raw(name).await?;
        Ok(got.map(|got| {
            let stored = match got {
                Ok((bytes, etag)) => decode(&bytes, etag),
                Err(version) => Stored::Corrupt {
                    version,
                    detail: format!("the object is larger than {MAX_RECORD_BYTES} bytes"),
                    salvaged_fence: None,
                },
            };
            (stored, age)
        }))
    }

    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: false,
            liveness: false,
            fence_source: "the writer's wall clock in microseconds, above the previous fence and, after cleanup, the fence high-water mark (ETags are hashes, not counters)",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::ServerDates,
        }
    }

    pub(crate) async fn get(&self, key: &Key) -> Result<Option<(Stored, Option<Duration>)>> {
        self.read(&self.object_name(key)).await
    }

    pub(crate) async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
        let body = encode(record)?;
        let a = self
            .put_raw(&self.object_name(key), body, Precondition::Absent)
            .await?;
        Ok(a.etag)
    }

    pub(crate) async fn replace(
        &self,
        key: &Key,
        record: &LeaseRecord,
        version: &str,
    ) -> Result<Option<String>> {
        let body = encode(record)?;
        let a = self
            .put_raw(&self.object_name(key), body, Precondition::Matches(version))
            .await?;
        Ok(a.etag)
    }

    pub(crate) async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        let a = self.delete_raw(&self.object_name(key), version).await?;
        Ok(matches!(a.status, 200 | 202 | 204))
    }

    /// Every record under the prefix whose key starts with `prefix`, with its server age.
    pub(crate) async fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Stored, Option<Duration>)>> {
        let mut out = Vec::new();
        for name in self.list_names().await? {
            if !name.ends_with(".json") {
                continue;
            }
            // Gone between the listing and the read: not there any more.
            let Some((stored, age)) = self.read(&name).await? else {
                continue;
            };
            let matches = match &stored {
                Stored::Record { record, .. } => record.key.starts_with(prefix),
                Stored::Corrupt { .. } => prefix.is_empty(),
            };
            if matches {
                let short = name.strip_prefix(&self.prefix).unwrap_or(&name).to_owned();
                out.push((short, stored, age));
            }
        }
        Ok(out)
    }
}

/// Implements [`crate::store::RecordStore`] for a public store type `$t` whose field `objects`
/// is an [`Objects`], and the raw requests every object store offers.
macro_rules! object_record_store {
    ($t:ty) => {
        #[async_trait::async_trait]
        impl $crate::store::RecordStore for $t {
            fn describe(&self) -> String {
                $crate::stores::object::Backend::describe(&self.objects.backend).to_owned()
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.objects.capabilities()
            }
            fn label_limit(&self) -> usize {
                $crate::stores::object::LABEL_LIMIT
            }
            fn floor(&self) -> Option<std::sync::Arc<dyn $crate::floor::Floor>> {
                Some(std::sync::Arc::new($crate::stores::object::ObjectFloor(
                    self.objects.clone(),
                )))
            }
            async fn get(
                &self,
                key: &$crate::key::Key,
            ) -> $crate::error::Result<Option<$crate::store::Stored>> {
                Ok(self.objects.get(key).await?.map(|(s, _)| s))
            }
            async fn get_dated(
                &self,
                key: &$crate::key::Key,
            ) -> $crate::error::Result<Option<($crate::store::Stored, Option<std::time::Duration>)>>
            {
                self.objects.get(key).await
            }
            fn server_clock(&self) -> bool {
                true
            }
            async fn create(
                &self,
                key: &$crate::key::Key,
                record: &$crate::record::LeaseRecord,
            ) -> $crate::error::Result<Option<String>> {
                self.objects.create(key, record).await
            }
            async fn replace(
                &self,
                key: &$crate::key::Key,
                record: &$crate::record::LeaseRecord,
                version: &str,
            ) -> $crate::error::Result<Option<String>> {
                self.objects.replace(key, record, version).await
            }
            async fn delete(
                &self,
                key: &$crate::key::Key,
                version: &str,
            ) -> $crate::error::Result<bool> {
                self.objects.delete(key, version).await
            }
            async fn list(
                &self,
                prefix: &str,
            ) -> $crate::error::Result<Vec<(String, $crate::store::Stored)>> {
                let all = self.objects.list(prefix).await?;
                Ok(all.into_iter().map(|(n, s, _)| (n, s)).collect())
            }
            async fn list_dated(
                &self,
                prefix: &str,
            ) -> $crate::error::Result<
                Vec<(String, $crate::store::Stored, Option<std::time::Duration>)>,
            > {
                self.objects.list(prefix).await
            }
        }

        impl $t {
            /// The object name of `key` (the prefix, the key's file-safe name, `.json`): what the
            /// cloud's own tools read.
            pub fn object_name(&self, key: &$crate::key::Key) -> String {
                self.objects.object_name(key)
            }

            /// The prefix every object name of this store starts with (empty, or ending in `/`).
            pub fn prefix(&self) -> &str {
                self.objects.prefix()
            }

            /// How many HTTP requests this store has sent (for measurements).
            pub fn requests(&self) -> u64 {
                self.objects.requests()
            }

            /// One raw conditional write of `body` to object `name`, bypassing the lock logic:
            /// the server's answer, a failed precondition included (for tests proving that the
            /// server honours preconditions, and for the benchmark's floor).
            ///
            /// # Errors
            /// [`Error::Unavailable`](crate::Error::Unavailable) when the server cannot be
            /// reached or does not answer in time; [`Error::Store`](crate::Error::Store) for an
            /// answer other than success or a failed precondition (access denied, no bucket).
            #[doc(hidden)]
            pub async fn raw_put(
                &self,
                name: &str,
                body: Vec<u8>,
                precondition: $crate::stores::object::Precondition<'_>,
            ) -> $crate::error::Result<$crate::stores::object::RawAnswer> {
                self.objects.put_raw(name, body.into(), precondition).await
            }

            /// One raw delete of object `name` if its ETag is still `etag` (`If-Match`): the
            /// server's answer, a failed precondition included.
            ///
            /// # Errors
            /// As [`raw_put`](Self::raw_put).
            #[doc(hidden)]
            pub async fn raw_delete(
                &self,
                name: &str,
                etag: &str,
            ) -> $crate::error::Result<$crate::stores::object::RawAnswer> {
                self.objects.delete_raw(name, etag).await
            }
        }
    };
}
pub(crate) use object_record_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_of_the_same_record_has_new_bytes() {
        let r = LeaseRecord::free("k", 7);
        let (a, b) = (encode(&r).unwrap(), encode(&r).unwrap());
        assert_ne!(a, b);
        assert!(matches!(decode(&a, "v".into()), Stored::Record { record, .. } if record == r));
    }

    #[test]
    fn a_record_too_large_is_refused_naming_the_limit() {
        let mut r = LeaseRecord::free("k", 7);
        r.labels.insert("big".into(), "x".repeat(MAX_RECORD_BYTES));
        let err = encode(&r).unwrap_err();
        assert!(matches!(err, Error::InvalidOption { name: "labels", .. }));
        assert!(err.to_string().contains("1048576 bytes (1 MiB)"), "{err}");
    }

    #[test]
    fn damaged_objects_are_corrupt_with_their_fence_salvaged() {
        let s = decode(br#"{"key":"k","fence": 42, "#, "v".into());
        assert!(
            matches!(
                s,
                Stored::Corrupt {
                    salvaged_fence: Some(42),
                    ..
                }
            ),
            "{s:?}"
        );
    }

    #[test]
    fn listing_xml_is_read() {
        let xml = "<R><Contents><Key>a/b&amp;c.json</Key></Contents><Contents><Key>x.json</Key></Contents><NextContinuationToken>t1</NextContinuationToken></R>";
        assert_eq!(xml_values(xml, "Key"), ["a/b&c.json", "x.json"]);
        assert_eq!(xml_values(xml, "NextContinuationToken"), ["t1"]);
        assert!(xml_values(xml, "Nope").is_empty());
    }
}
