//! What the object stores' requests are signed from: [`ToSign`], the request as it will be sent
//! but for its `Authorization` (S3 signs it with Signature Version 4, Azure with Shared Key, GCS
//! adds a bearer token), and the pieces the signers share: HMAC-SHA256 and SHA-256 (`ring`,
//! already the TLS provider), URI encoding, and request times.

use super::transport::Body;
use crate::error::{Error, Result};
use hyper::body::Bytes;
use hyper::{Method, Request};
use std::time::SystemTime;

/// A request as it will be sent, but for its `Authorization` header.
#[derive(Debug)]
pub(crate) struct ToSign {
    pub(crate) method: Method,
    /// The URL path as sent (encoded).
    pub(crate) path: String,
    /// Query parameters, not encoded.
    pub(crate) query: Vec<(&'static str, String)>,
    /// Every header but `Authorization` and `Content-Length` (names lower case); a `host`
    /// header is signed but not sent (the client sends the URL's).
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Bytes,
}

impl ToSign {
    /// A request of `method` to `path` with no query, header or body yet.
    pub(crate) fn new(method: Method, path: String) -> Self {
        ToSign {
            method,
            path,
            query: Vec::new(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Header `name`'s value (`name` lower case).
    #[cfg_attr(not(any(feature = "s3", feature = "azure")), allow(dead_code))] // the signers' and S3/Azure's only
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The query string as signed (S3) and as sent: encoded pairs, sorted.
    pub(crate) fn query_string(&self) -> String {
        let mut pairs: Vec<(String, String)> = self
            .query
            .iter()
            .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
            .collect();
        pairs.sort();
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The HTTP request to `origin` (`scheme://host[:port]`), with `authorization` if any.
    ///
    /// # Errors
    /// [`Error::Store`] when a part is not valid in a request (`store` names the store).
    pub(crate) fn into_request(
        self,
        origin: &str,
        authorization: Option<String>,
        store: &str,
    ) -> Result<Request<Body>> {
        let uri = match self.query_string() {
            q if q.is_empty() => format!("{origin}{}", self.path),
            q => format!("{origin}{}?{q}", self.path),
        };
        let mut b = Request::builder().method(self.method).uri(uri);
        for (k, v) in self.headers.iter().filter(|(k, _)| k != "host") {
            b = b.header(k.as_str(), v.as_str());
        }
        if let Some(auth) = authorization {
            b = b.header("authorization", auth);
        }
        b.body(Body::new(self.body)).map_err(|e| Error::Store {
            store: store.to_owned(),
            detail: format!("cannot build the request: {e}"),
            retryable: false,
            source: None,
        })
    }
}

/// HMAC-SHA256 of `data` under `key`.
#[cfg_attr(not(any(feature = "s3", feature = "azure")), allow(dead_code))] // the signers' and S3/Azure's only
pub(crate) fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&key, data).as_ref().to_vec()
}

/// SHA-256 of `data`, in lower-case hex.
#[cfg_attr(not(feature = "s3"), allow(dead_code))] // S3's signature only
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

/// Lower-case hex.
#[cfg_attr(not(feature = "s3"), allow(dead_code))] // S3's signature only
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Percent-encodes every byte but `A-Z a-z 0-9 - _ . ~` (and `/` when `keep_slash`), as AWS
/// Signature Version 4 and Azure's canonical paths want it.
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A request time: `(YYYYMMDDTHHMMSSZ, RFC 1123)`, e.g. `("20130524T000000Z", "Fri, 24 May
/// 2013 00:00:00 GMT")`.
#[cfg_attr(not(any(feature = "s3", feature = "azure")), allow(dead_code))] // the signers' and S3/Azure's only
pub(crate) fn times(t: SystemTime) -> (String, String) {
    let rfc3339 = humantime::format_rfc3339_seconds(t).to_string(); // 2013-05-24T00:00:00Z
    let amz: String = rfc3339.chars().filter(|c| *c != '-' && *c != ':').collect();
    let days = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let field = |a: usize, b: usize| rfc3339.get(a..b).unwrap_or("00");
    let month = field(5, 7).parse::<usize>().unwrap_or(1).clamp(1, 12);
    let http = format!(
        "{}, {} {} {} {} GMT",
        WEEKDAYS[(days % 7) as usize],
        field(8, 10),
        MONTHS[month - 1],
        field(0, 4),
        field(11, 19)
    );
    (amz, http)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_in_both_forms() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600); // 2013-05-24
        let (amz, http) = times(t);
        assert_eq!(amz, "20130524T000000Z");
        assert_eq!(http, "Fri, 24 May 2013 00:00:00 GMT");
        let (_, http) = times(SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000 + 3_723));
        assert_eq!(http, "Wed, 18 Nov 2026 12:08:43 GMT");
    }

    #[test]
    fn uri_encoding_keeps_only_unreserved_bytes() {
        assert_eq!(uri_encode("a b/c~d+é", true), "a%20b/c~d%2B%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }
}
