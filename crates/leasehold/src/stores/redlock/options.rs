//! The Redlock store's options, as a `redlock://` URL gives them.

use super::RedlockStore;
use crate::error::{Error, Result};
use crate::store::LockStore;
use crate::stores::redis::RedisOptions;
use crate::url::Params;
use std::sync::Arc;
use std::time::Duration;

/// Options of the Redlock store: its nodes and how each is used. `Debug` never shows a
/// password.
///
/// ```
/// use leasehold::stores::redlock::RedlockOptions;
/// use std::time::Duration;
/// let o = RedlockOptions::from_url("redlock://u:s3cret@h1:6379,h2:6379,h3:6379/0?prefix=jobs:lock:")?;
/// assert_eq!(o.nodes, ["redis://u:s3cret@h1:6379/0", "redis://u:s3cret@h2:6379/0", "redis://u:s3cret@h3:6379/0"]);
/// assert_eq!((o.node.prefix.as_str(), o.node.timeout), ("jobs:lock:", Duration::from_millis(200)));
/// assert!(!format!("{o:?}").contains("s3cret"));
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct RedlockOptions {
    /// Each node's `redis://` URL (independent primaries; three or five are usual).
    pub nodes: Vec<String>,
    /// How every node is used (its [`RedisOptions::url`] is not read): the prefixes, the
    /// per-node timeout (default 200 ms) and TLS files. Replicas are refused: a majority of
    /// nodes is Redlock's safeguard.
    pub node: RedisOptions,
}

impl std::fmt::Debug for RedlockOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| crate::url::redact(n)).collect();
        f.debug_struct("RedlockOptions")
            .field("nodes", &nodes)
            .field("node", &self.node)
            .finish()
    }
}

impl RedlockOptions {
    /// Options for the nodes at `nodes` (`redis://…` each), every other one at its default.
    ///
    /// ```
    /// let o = leasehold::stores::redlock::RedlockOptions::new(["redis://h1:6379/0", "redis://h2:6379/0"]);
    /// assert_eq!(o.node.timeout, std::time::Duration::from_millis(200));
    /// ```
    pub fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        RedlockOptions {
            nodes: nodes.into_iter().map(Into::into).collect(),
            node: RedisOptions {
                timeout: Duration::from_millis(200),
                ..RedisOptions::default()
            },
        }
    }

    /// The options a `redlock://[user:pass@]h1:p1,h2:p2,…[/db][?prefix=…&timeout=…]` URL gives:
    /// the nodes' `redis://` URLs, and the parameters of a Redis URL (those of
    /// [`RedisOptions::from_url`]).
    ///
    /// ```
    /// use leasehold::stores::redlock::RedlockOptions;
    /// let o = RedlockOptions::from_url("redlock://h1:6379,h2:6379,h3:6379/1?timeout=300ms")?;
    /// assert_eq!(o.nodes[2], "redis://h3:6379/1");
    /// assert!(RedlockOptions::from_url("redlock://h1:6379,h2/0").is_err()); // no port
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a bad server list, database, value or an unknown parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let described = crate::url::redact(url);
        let list = crate::stores::redis::host_list(url, "redlock", &described)?;
        let db = list.path;
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(Error::InvalidUrl {
                url: described,
                reason: "the database must be a number, as in /0".into(),
            });
        }
        let nodes = list
            .hosts
            .iter()
            .map(|host| format!("redis://{}{host}/{db}", list.userinfo));
        let mut o = RedlockOptions::new(nodes);
        let mut params = Params::of_query(url, list.query);
        o.node.read(&mut params)?;
        params.finish()?;
        Ok(o)
    }
}

impl crate::store::StoreOptions for RedlockOptions {
    fn from_url(url: &str) -> Result<Self> {
        RedlockOptions::from_url(url)
    }

    async fn connect(self) -> Result<Arc<dyn LockStore>> {
        Ok(Arc::new(RedlockStore::connect(self).await?))
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        Ok(vec![self.node.timeout])
    }
}
