//! The Kubernetes store's options ([`KubernetesOptions`]) and its URL,
//! `k8s://[NAMESPACE][?prefix=…&server=…&timeout=…&max_clock_skew=…]`.

use super::{valid_label, KubernetesStore, DEFAULT_PREFIX};
use crate::error::{Error, Result};
use crate::url::Params;
use std::time::Duration;

/// How to reach the cluster and name Leases.
///
/// ```
/// use leasehold::stores::kubernetes::KubernetesOptions;
/// let o = KubernetesOptions::from_url("k8s://jobs?prefix=etl-&timeout=5s")?;
/// assert_eq!((o.namespace.as_deref(), o.prefix.as_str()), (Some("jobs"), "etl-"));
/// let mut o = KubernetesOptions::default();
/// o.server = Some("http://127.0.0.1:8080".into());
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KubernetesOptions {
    /// The namespace; `None`: `POD_NAMESPACE`, else the kubeconfig's, else `default`.
    pub namespace: Option<String>,
    /// Lease name prefix (`[a-z0-9-]`, at most 40 characters). Default `leasehold-`.
    pub prefix: String,
    /// An API server URL to use directly without credentials (tests); `None`: `KUBECONFIG` or
    /// in-cluster configuration.
    pub server: Option<String>,
    /// Per-request timeout. Default 10 s.
    pub timeout: Duration,
    /// The largest difference between pods' wall clocks assumed (`?max_clock_skew=`, default
    /// [`crate::options::DEFAULT_MAX_CLOCK_SKEW`]): the adapter's, which
    /// [`KubernetesStore::connect`] does not read; give it to
    /// [`crate::adapter::RecordLockStore::with_max_clock_skew`] (`open_store` does).
    pub max_clock_skew: Duration,
}

impl Default for KubernetesOptions {
    fn default() -> Self {
        KubernetesOptions {
            namespace: None,
            prefix: DEFAULT_PREFIX.into(),
            server: None,
            timeout: Duration::from_secs(10),
            max_clock_skew: crate::options::DEFAULT_MAX_CLOCK_SKEW,
        }
    }
}

impl KubernetesOptions {
    /// The options a `k8s://` or `kubernetes://` URL gives, checked as
    /// [`KubernetesStore::connect`] checks them before it looks for a cluster.
    ///
    /// ```
    /// use leasehold::stores::kubernetes::KubernetesOptions;
    /// let o = KubernetesOptions::from_url("k8s://?server=http://127.0.0.1:8080")?;
    /// assert_eq!(o.namespace, None); // POD_NAMESPACE, else the kubeconfig's, else default
    /// assert!(KubernetesOptions::from_url("k8s://jobs?prefix=UPPER").is_err());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a bad namespace, prefix, server, timeout or unknown parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = crate::url::parse(url)?;
        let mut params = Params::new(&parsed);
        let mut o = KubernetesOptions::default();
        let host = parsed.host_str().unwrap_or_default();
        if !host.is_empty() {
            o.namespace = Some(host.to_owned());
        }
        if !(parsed.path().is_empty() || parsed.path() == "/") {
            return Err(params.invalid(
                "expected k8s://NAMESPACE[?prefix=…&server=…&timeout=…], without a path",
            ));
        }
        if let Some(prefix) = params.take_str("prefix") {
            o.prefix = prefix;
        }
        o.server = params.take_str("server");
        if let Some(t) = params.take_duration("timeout")? {
            o.timeout = t;
        }
        o.max_clock_skew = params.take_max_clock_skew()?;
        params.finish()?;
        o.check().map_err(|e| crate::url::option_error_in(url, e))?;
        Ok(o)
    }

    /// Checks what can be checked before looking for a cluster: the prefix, timeout, a given
    /// server and a given namespace.
    pub(super) fn check(&self) -> Result<()> {
        let p = &self.prefix;
        if p.len() > 40
            || !p
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            || p.starts_with('-')
        {
            return Err(Error::option(
                "prefix",
                format!("{p:?}: at most 40 of [a-z0-9-], not starting with '-'"),
            ));
        }
        if self.timeout.is_zero() {
            return Err(Error::option("timeout", "must be more than zero"));
        }
        if let Some(server) = &self.server {
            server_uri(server)?;
        }
        if let Some(namespace) = &self.namespace {
            check_namespace(namespace)?;
        }
        Ok(())
    }
}

/// A namespace is a DNS-1123 label.
pub(super) fn check_namespace(namespace: &str) -> Result<()> {
    if valid_label(namespace) {
        return Ok(());
    }
    Err(Error::option(
        "namespace",
        format!("{namespace:?} is not a DNS-1123 label ([a-z0-9-], at most 63)"),
    ))
}

/// The API server's URI: `http://HOST[:PORT]` or `https://…`.
pub(super) fn server_uri(server: &str) -> Result<http::Uri> {
    let uri: http::Uri = server
        .parse()
        .map_err(|e| Error::option("server", format!("{server:?}: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(Error::option(
            "server",
            format!("{server:?}: expected http://HOST:PORT or https://HOST:PORT"),
        ));
    }
    Ok(uri)
}

impl crate::store::RecordStoreOptions for KubernetesOptions {
    type Store = KubernetesStore;
    const OPTION_IS_URL_ERROR: bool = true;

    fn from_url(url: &str) -> Result<Self> {
        KubernetesOptions::from_url(url)
    }

    fn max_clock_skew(&self) -> Duration {
        self.max_clock_skew
    }

    async fn connect(self) -> Result<KubernetesStore> {
        KubernetesStore::connect(self).await
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        Ok(vec![self.timeout])
    }
}
