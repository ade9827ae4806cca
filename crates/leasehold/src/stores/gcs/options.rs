//! The GCS store's options ([`GcsOptions`]) and its URL,
//! `gs://BUCKET/PREFIX[?endpoint=…&timeout=…&foreign_ttl=…&max_clock_skew=…]`.

use super::{GcsStore, DEFAULT_FOREIGN_TTL, MAX_NAME};
use crate::error::{Error, Result};
use crate::url::Params;
use std::time::Duration;

/// How to reach the bucket and name objects. `Debug` shows no secret (there is none here:
/// credentials come from the environment's chain, never from options).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GcsOptions {
    /// The bucket (it must exist).
    pub bucket: String,
    /// The object name prefix; `locks` puts key `K` at `locks/K`. Default empty.
    pub prefix: String,
    /// A JSON API endpoint to use without credentials (an emulator, `http://127.0.0.1:4443`);
    /// `None`: `STORAGE_EMULATOR_HOST` if set, else [`super::GOOGLE_ENDPOINT`] with Google credentials.
    pub endpoint: Option<String>,
    /// Per-request timeout. Default 10 s.
    pub timeout: Duration,
    /// How long a lease or waiter registration written by another client (an object without
    /// leasehold's field, or whose field describes another lease) lasts: it is over once a
    /// contender has seen it unchanged for this long. It must be at least that client's lease
    /// length (the single-waiter lock service renews well within it). Default [`DEFAULT_FOREIGN_TTL`].
    pub foreign_ttl: Duration,
    /// The largest difference between machines' wall clocks assumed; give the adapter's
    /// ([`crate::adapter::RecordLockStore::with_max_clock_skew`]) the same. The `expiresAt`
    /// written for the other client is the lease's expiry plus this margin, because that client
    /// judges it on its own wall clock with none. Default
    /// [`crate::options::DEFAULT_MAX_CLOCK_SKEW`].
    pub max_clock_skew: Duration,
}

impl GcsOptions {
    /// Options for `bucket`, every other one at its default.
    ///
    /// ```
    /// let o = leasehold::stores::gcs::GcsOptions::new("my-bucket");
    /// assert_eq!((o.prefix.as_str(), o.endpoint, o.timeout.as_secs()), ("", None, 10));
    /// ```
    pub fn new(bucket: impl Into<String>) -> Self {
        GcsOptions {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            timeout: Duration::from_secs(10),
            foreign_ttl: DEFAULT_FOREIGN_TTL,
            max_clock_skew: crate::options::DEFAULT_MAX_CLOCK_SKEW,
        }
    }

    /// The options a `gs://BUCKET/PREFIX` or `gcs://…` URL gives (`?endpoint=`, `?timeout=`,
    /// `?foreign_ttl=`, `?max_clock_skew=`), checked as [`GcsStore::connect`] checks them.
    ///
    /// ```
    /// use leasehold::stores::gcs::GcsOptions;
    /// let o = GcsOptions::from_url("gs://my-bucket/locks?timeout=5s")?;
    /// assert_eq!((o.bucket.as_str(), o.prefix.as_str()), ("my-bucket", "/locks"));
    /// assert!(GcsOptions::from_url("gs://my-bucket/locks?nope=1").is_err());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a bad bucket, prefix, endpoint, timeout or unknown parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = crate::url::parse(url)?;
        let mut params = Params::new(&parsed);
        let bucket = parsed.host_str().unwrap_or_default();
        if bucket.is_empty() {
            return Err(params.invalid("expected gs://BUCKET/PREFIX"));
        }
        let mut o = GcsOptions::new(bucket);
        o.prefix = percent_encoding::percent_decode_str(parsed.path())
            .decode_utf8()
            .map_err(|e| params.invalid(format!("the prefix is not UTF-8: {e}")))?
            .into_owned();
        o.endpoint = params.take_str("endpoint");
        for (name, field) in [
            ("timeout", &mut o.timeout),
            ("foreign_ttl", &mut o.foreign_ttl),
        ] {
            if let Some(d) = params.take_duration(name)? {
                *field = d;
            }
        }
        o.max_clock_skew = params.take_max_clock_skew()?;
        params.finish()?;
        o.check().map_err(|e| crate::url::option_error_in(url, e))?;
        Ok(o)
    }

    /// Checks what can be checked without connecting: the bucket, prefix, durations and a
    /// given endpoint.
    pub(super) fn check(&self) -> Result<()> {
        if !valid_bucket(&self.bucket) {
            return Err(Error::option(
                "bucket",
                format!(
                    "{:?} is not a bucket name ([a-z0-9._-], 3 to 222 characters, starting and ending alphanumeric)",
                    self.bucket
                ),
            ));
        }
        let prefix = self.prefix.trim_matches('/');
        if prefix.len() > MAX_NAME / 2 || prefix.chars().any(char::is_control) {
            return Err(Error::option(
                "prefix",
                format!("{prefix:?}: at most 512 bytes, no control characters"),
            ));
        }
        if self.timeout.is_zero() {
            return Err(Error::option("timeout", "must be more than zero"));
        }
        if self.foreign_ttl.is_zero() {
            return Err(Error::option("foreign_ttl", "must be more than zero"));
        }
        if let Some(endpoint) = &self.endpoint {
            check_endpoint(endpoint)?;
        }
        Ok(())
    }
}

/// An endpoint is `http://HOST[:PORT]` or `https://…`.
pub(super) fn check_endpoint(endpoint: &str) -> Result<()> {
    let parsed = url::Url::parse(endpoint)
        .map_err(|e| Error::option("endpoint", format!("{endpoint:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(Error::option(
            "endpoint",
            format!("{endpoint:?}: expected http://HOST:PORT or https://HOST:PORT"),
        ));
    }
    Ok(())
}

impl crate::store::RecordStoreOptions for GcsOptions {
    type Store = GcsStore;
    const OPTION_IS_URL_ERROR: bool = true;

    fn from_url(url: &str) -> Result<Self> {
        GcsOptions::from_url(url)
    }

    fn max_clock_skew(&self) -> Duration {
        self.max_clock_skew
    }

    async fn connect(self) -> Result<GcsStore> {
        GcsStore::connect(self).await
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        Ok(vec![self.timeout])
    }
}

fn valid_bucket(b: &str) -> bool {
    (3..=222).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(&c))
        && b.starts_with(|c: char| c.is_ascii_alphanumeric())
        && b.ends_with(|c: char| c.is_ascii_alphanumeric())
}
