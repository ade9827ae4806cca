//! The Azure store's options ([`AzureOptions`]) and its URL,
//! `az://CONTAINER/PREFIX[?account=…&endpoint=…&timeout=…&max_clock_skew=…]`.

use super::{AzureCredentials, AzureStore};
use crate::error::Result;
use crate::url::Params;
use std::time::Duration;

/// How to reach a container; every default is stated. `Debug` never shows a key.
///
/// ```
/// use leasehold::stores::azure::{AzureCredentials, AzureOptions};
/// let mut o = AzureOptions::new("locks");
/// o.credentials = Some(AzureCredentials::new("acct", "a2V5"));
/// assert!(!format!("{o:?}").contains("a2V5"));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AzureOptions {
    /// The container (it must exist).
    pub container: String,
    /// Blob names start with this (a `/` is added); default empty.
    pub prefix: String,
    /// The storage account; `None`: the credentials' or the environment's.
    pub account: Option<String>,
    /// The Blob endpoint, e.g. `http://127.0.0.1:10000/devstoreaccount1`; `None`: the
    /// connection string's, else `https://ACCOUNT.blob.core.windows.net`.
    pub endpoint: Option<String>,
    /// The account and key; `None`: from the environment (see the module documentation).
    pub credentials: Option<AzureCredentials>,
    /// Per-request timeout. Default 10 s.
    pub timeout: Duration,
    /// The largest difference between machines' wall clocks assumed (`?max_clock_skew=`,
    /// default [`crate::options::DEFAULT_MAX_CLOCK_SKEW`]): the adapter's, which
    /// [`AzureStore::connect`] does not read; give it to
    /// [`crate::adapter::RecordLockStore::with_max_clock_skew`] (`open_store` does).
    pub max_clock_skew: Duration,
}

impl AzureOptions {
    /// The options for `container`, every other one at its default.
    pub fn new(container: impl Into<String>) -> Self {
        AzureOptions {
            container: container.into(),
            prefix: String::new(),
            account: None,
            endpoint: None,
            credentials: None,
            timeout: Duration::from_secs(10),
            max_clock_skew: crate::options::DEFAULT_MAX_CLOCK_SKEW,
        }
    }

    /// The options an `az://CONTAINER/PREFIX` (or `azure://…`) URL gives (credentials from the
    /// environment, when connecting).
    ///
    /// ```
    /// use leasehold::stores::azure::AzureOptions;
    /// let o = AzureOptions::from_url("az://locks/app?account=acct&timeout=5s")?;
    /// assert_eq!((o.container.as_str(), o.prefix.as_str()), ("locks", "app"));
    /// assert_eq!(o.account.as_deref(), Some("acct"));
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::InvalidUrl`] for a bad timeout or an unknown parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = crate::url::parse(url)?;
        let mut params = Params::new(&parsed);
        let mut o = AzureOptions::new(parsed.host_str().unwrap_or_default());
        o.prefix = parsed.path().trim_start_matches('/').to_owned();
        o.account = params.take_str("account");
        o.endpoint = params.take_str("endpoint");
        if let Some(t) = params.take_duration("timeout")? {
            o.timeout = t;
        }
        o.max_clock_skew = params.take_max_clock_skew()?;
        params.finish()?;
        Ok(o)
    }
}

impl crate::store::RecordStoreOptions for AzureOptions {
    type Store = AzureStore;
    const OPTION_IS_URL_ERROR: bool = true;

    fn from_url(url: &str) -> Result<Self> {
        AzureOptions::from_url(url)
    }

    fn max_clock_skew(&self) -> Duration {
        self.max_clock_skew
    }

    async fn connect(self) -> Result<AzureStore> {
        AzureStore::connect(self)
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        AzureStore::connect(self.clone())?;
        Ok(Vec::new())
    }
}
