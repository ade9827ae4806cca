//! Amazon S3 store: `s3://BUCKET[/PREFIX][?endpoint=…&region=…&profile=…&timeout=…]`, for AWS
//! and S3-compatible servers.
//!
//! Checklist:
//! - **records**: one JSON object per key, `PREFIX/NAME.json` (NAME: the key's file-safe name);
//!   the record plus a `write` nonce, so every write changes the ETag ([`crate::stores::object`]);
//! - **writes**: `PutObject` with `If-None-Match: *` to create, `If-Match: <ETag>` to replace;
//!   `DeleteObject` with `If-Match` (only `cleanup` deletes: a release is a conditional replace
//!   that frees the record and keeps its fence). A failed precondition (412, or 409 when S3
//!   reports a concurrent conditional write) is a lost race. The server must honour both
//!   preconditions: AWS S3 does (conditional writes since August 2024, conditional deletes since
//!   September 2025), as do moto and most S3-compatible servers of 2025 and later; a server that
//!   ignored `If-None-Match` would break exclusion, so check yours with
//!   `S3Store::raw_put` twice (the second must answer 412);
//! - **expiry**: judged by observation ([`crate::adapter`]): a held record is taken once seen
//!   unchanged for its TTL plus 1 % + 2 ms on this machine's monotonic clock, or once its
//!   written expiry is older than now − `max_clock_skew`;
//! - **fence**: floored at the writer's wall clock in microseconds, above the previous fence,
//!   and, for an object created again after `cleanup`, at the fence high-water mark
//!   (ETags are hashes, not counters);
//! - **watch**: none; waiters poll with capped, jittered backoff (see the book's S3 page for the
//!   requests this costs);
//! - **credentials**: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`, else
//!   the profile (`?profile=`, else `AWS_PROFILE`, else `default`) of `~/.aws/credentials` and
//!   `~/.aws/config`; region: `?region=`, `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's,
//!   else `us-east-1`; endpoint: `?endpoint=`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, else
//!   `https://BUCKET.s3.REGION.amazonaws.com`. A custom endpoint is addressed path-style
//!   (`ENDPOINT/BUCKET/OBJECT`). Requests are signed with Signature Version 4.
//!
//! The client is leasehold's own, small: `hyper` with rustls, and Signature Version 4 written
//! out in its `sigv4` module (checked against AWS's published examples). The `object_store` crate
//! (Apache Arrow) was the first choice, but it has no conditional delete, and the AWS SDK would
//! add some hundred crates to a build that only needs five request kinds.

mod credentials;
mod options;
mod sigv4;

pub use credentials::AwsCredentials;

pub use options::S3Options;

use crate::error::{Error, Result};
use crate::stores::object::sign::{sha256_hex, times, uri_encode, ToSign};
use crate::stores::object::transport::Body;
use crate::stores::object::{object_record_store, xml_values, Backend, Call, Objects, Page};
use hyper::Request;
use std::time::SystemTime;

/// How requests reach the bucket.
#[derive(Debug)]
struct S3 {
    describe: String,
    bucket: String,
    credentials: AwsCredentials,
    region: String,
    /// `http` or `https`.
    scheme: String,
    /// The `Host` header.
    host: String,
    /// Path-style addressing: the bucket is the path's first segment.
    path_style: bool,
}

impl Backend for S3 {
    fn describe(&self) -> &str {
        &self.describe
    }

    fn request(&self, call: Call) -> Result<Request<Body>> {
        let bucket = if self.path_style {
            format!("/{}", uri_encode(&self.bucket, false))
        } else {
            String::new()
        };
        let path = match &call.object {
            Some(name) => format!("{bucket}/{}", uri_encode(name, true)),
            None if bucket.is_empty() => "/".to_owned(),
            None => bucket,
        };
        let (amz_date, _) = times(SystemTime::now());
        let mut r = ToSign::new(call.method, path);
        r.headers = vec![
            ("host".into(), self.host.clone()),
            ("x-amz-date".into(), amz_date),
            ("x-amz-content-sha256".into(), sha256_hex(&call.body)),
        ];
        if let Some(t) = &self.credentials.session_token {
            r.headers.push(("x-amz-security-token".into(), t.clone()));
        }
        r.headers
            .extend(call.headers.into_iter().map(|(k, v)| (k.to_owned(), v)));
        (r.query, r.body) = (call.query, call.body);
        let auth = sigv4::authorization(&r, &self.credentials, &self.region);
        let origin = format!("{}://{}", self.scheme, self.host);
        r.into_request(&origin, Some(auth), &self.describe)
    }

    fn put_headers(&self) -> Vec<(&'static str, String)> {
        vec![]
    }

    fn list_query(&self, prefix: &str, next: Option<&str>) -> Vec<(&'static str, String)> {
        let mut q = vec![("list-type", "2".to_owned()), ("prefix", prefix.to_owned())];
        if let Some(n) = next {
            q.push(("continuation-token", n.to_owned()));
        }
        q
    }

    fn parse_list(&self, xml: &str) -> Page {
        let truncated = xml_values(xml, "IsTruncated").first().map(String::as_str) == Some("true");
        Page {
            names: xml_values(xml, "Key"),
            next: if truncated {
                xml_values(xml, "NextContinuationToken").into_iter().next()
            } else {
                None
            },
        }
    }

    fn denied_hint(&self) -> &'static str {
        "the access key needs s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket on the bucket and prefix"
    }
}

/// A [`RecordStore`](crate::RecordStore) over objects of an S3 bucket; wrap it in
/// [`crate::adapter::RecordLockStore`] (as `open_store("s3://…")` does) for a lock store.
///
/// ```no_run
/// # async fn f() -> leasehold::Result<()> {
/// use leasehold::{adapter::RecordLockStore, stores::s3::{S3Options, S3Store}, Locks};
/// let mut o = S3Options::new("my-bucket");
/// o.prefix = "locks".into();
/// let locks = Locks::new(RecordLockStore::new(S3Store::connect(o)?));
/// let guard = locks.lock("nightly-report")?.try_acquire().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct S3Store {
    objects: std::sync::Arc<Objects<S3>>,
}

object_record_store!(S3Store);

/// A bucket name S3 accepts: 3–63 of `[a-z0-9.-]`, starting and ending alphanumeric.
fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && b.starts_with(|c: char| c.is_ascii_alphanumeric())
        && b.ends_with(|c: char| c.is_ascii_alphanumeric())
}

impl S3Store {
    /// Connects with `options` (no request is sent until the first operation).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a bad bucket, endpoint or timeout, or when no credentials
    /// are found.
    pub fn connect(options: S3Options) -> Result<Self> {
        if !valid_bucket(&options.bucket) {
            return Err(Error::option(
                "bucket",
                format!(
                    "{:?}: 3 to 63 of [a-z0-9.-], starting and ending with a letter or digit",
                    options.bucket
                ),
            ));
        }
        if options.timeout.is_zero() {
            return Err(Error::option("timeout", "must be more than zero"));
        }
        let r = credentials::resolve(
            options.credentials,
            options.region,
            options.endpoint,
            options.profile.as_deref(),
        )?;
        let (scheme, host, path_style) = match &r.endpoint {
            Some(e) => {
                let u = url::Url::parse(e)
                    .map_err(|err| Error::option("endpoint", format!("{e:?}: {err}")))?;
                let host = match (u.host_str(), u.port()) {
                    (Some(h), Some(p)) => format!("{h}:{p}"),
                    (Some(h), None) => h.to_owned(),
                    (None, _) => String::new(),
                };
                if !matches!(u.scheme(), "http" | "https") || host.is_empty() {
                    return Err(Error::option(
                        "endpoint",
                        format!("{e:?}: expected http://HOST[:PORT] or https://HOST[:PORT]"),
                    ));
                }
                (u.scheme().to_owned(), host, true)
            }
            None if options.bucket.contains('.') => (
                "https".to_owned(),
                format!("s3.{}.amazonaws.com", r.region),
                true,
            ),
            None => (
                "https".to_owned(),
                format!("{}.s3.{}.amazonaws.com", options.bucket, r.region),
                false,
            ),
        };
        let via = match &r.endpoint {
            Some(e) => format!("?endpoint={e}"),
            None => String::new(),
        };
        let describe = format!(
            "s3://{}/{}{via}",
            options.bucket,
            options.prefix.trim_start_matches('/')
        );
        let backend = S3 {
            describe,
            bucket: options.bucket,
            credentials: r.credentials,
            region: r.region,
            scheme,
            host,
            path_style,
        };
        Ok(S3Store {
            objects: std::sync::Arc::new(Objects::new(backend, &options.prefix, options.timeout)?),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.objects.backend.bucket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        assert!(valid_bucket("locks") && valid_bucket("my.locks-1"));
        for bad in ["", "ab", "Locks", "-x-", "a_b", &"x".repeat(64)] {
            assert!(!valid_bucket(bad), "{bad}");
        }
    }

    #[test]
    fn urls_name_what_is_wrong_and_never_show_a_secret() {
        let open = |u: &str| S3Options::from_url(u).and_then(S3Store::connect);
        let err = open("s3://Bad_Bucket/p").unwrap_err().to_string();
        assert!(err.contains("bucket"), "{err}");
        let err = open("s3://locks/p?nope=1").unwrap_err().to_string();
        assert!(err.contains("unknown parameter \"nope\""), "{err}");
        let mut o = S3Options::new("locks");
        o.credentials = Some(AwsCredentials::new("AKID", "s3cret", Some("tok3n".into())));
        o.endpoint = Some("http://127.0.0.1:9".into());
        let store = S3Store::connect(o).unwrap();
        let shown = format!("{store:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("tok3n"),
            "{shown}"
        );
        assert_eq!(
            store.object_name(&crate::key::Key::new("job").unwrap()),
            "job.json"
        );
    }
}
