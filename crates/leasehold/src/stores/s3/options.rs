//! The S3 store's options ([`S3Options`]) and its URL,
//! `s3://BUCKET/PREFIX[?endpoint=…&region=…&profile=…&timeout=…&max_clock_skew=…]`.

use super::{AwsCredentials, S3Store};
use crate::error::Result;
use crate::url::Params;
use std::time::Duration;

/// How to reach a bucket; every default is stated. `Debug` never shows a secret.
///
/// ```
/// use leasehold::stores::s3::{AwsCredentials, S3Options};
/// let mut o = S3Options::new("locks");
/// o.credentials = Some(AwsCredentials::new("AKID", "s3cret", None));
/// assert!(!format!("{o:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct S3Options {
    /// The bucket (it must exist).
    pub bucket: String,
    /// Object names start with this (a `/` is added); default empty.
    pub prefix: String,
    /// The endpoint, e.g. `http://127.0.0.1:9000`; `None`: `AWS_ENDPOINT_URL_S3`,
    /// `AWS_ENDPOINT_URL`, the profile's `endpoint_url`, else AWS.
    pub endpoint: Option<String>,
    /// The region; `None`: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's, else `us-east-1`.
    pub region: Option<String>,
    /// The access key; `None`: the environment, else the profile.
    pub credentials: Option<AwsCredentials>,
    /// The profile to read; `None`: `AWS_PROFILE`, else `default`.
    pub profile: Option<String>,
    /// Per-request timeout. Default 10 s.
    pub timeout: Duration,
    /// The largest difference between machines' wall clocks assumed (`?max_clock_skew=`,
    /// default [`crate::options::DEFAULT_MAX_CLOCK_SKEW`]): the adapter's, which
    /// [`S3Store::connect`] does not read; give it to
    /// [`crate::adapter::RecordLockStore::with_max_clock_skew`] (`open_store` does).
    pub max_clock_skew: Duration,
}

impl S3Options {
    /// The options for `bucket`, every other one at its default.
    pub fn new(bucket: impl Into<String>) -> Self {
        S3Options {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            region: None,
            credentials: None,
            profile: None,
            timeout: Duration::from_secs(10),
            max_clock_skew: crate::options::DEFAULT_MAX_CLOCK_SKEW,
        }
    }

    /// The options an `s3://BUCKET/PREFIX` URL gives (credentials from the environment or a
    /// profile, when connecting).
    ///
    /// ```
    /// use leasehold::stores::s3::S3Options;
    /// let o = S3Options::from_url("s3://locks/app?endpoint=http://127.0.0.1:9000&region=eu-west-1")?;
    /// assert_eq!((o.bucket.as_str(), o.prefix.as_str()), ("locks", "app"));
    /// assert_eq!(o.region.as_deref(), Some("eu-west-1"));
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::InvalidUrl`] for a bad timeout or an unknown parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = crate::url::parse(url)?;
        let mut params = Params::new(&parsed);
        let mut o = S3Options::new(parsed.host_str().unwrap_or_default());
        o.prefix = parsed.path().trim_start_matches('/').to_owned();
        o.endpoint = params.take_str("endpoint");
        o.region = params.take_str("region");
        o.profile = params.take_str("profile");
        if let Some(t) = params.take_duration("timeout")? {
            o.timeout = t;
        }
        o.max_clock_skew = params.take_max_clock_skew()?;
        params.finish()?;
        Ok(o)
    }
}

impl crate::store::RecordStoreOptions for S3Options {
    type Store = S3Store;
    const OPTION_IS_URL_ERROR: bool = true;

    fn from_url(url: &str) -> Result<Self> {
        S3Options::from_url(url)
    }

    fn max_clock_skew(&self) -> Duration {
        self.max_clock_skew
    }

    async fn connect(self) -> Result<S3Store> {
        S3Store::connect(self)
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        S3Store::connect(self.clone())?;
        Ok(Vec::new())
    }
}
