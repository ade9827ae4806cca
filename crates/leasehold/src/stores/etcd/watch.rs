//! Change notification: an etcd watch on a key's lease record, waiter registration and permit
//! keys, on one watch stream.

use super::error::{bounded, map_err, retried};
use crate::error::Result;
use crate::store::ChangeWatch;
use async_trait::async_trait;
use std::time::Duration;

/// A watch of one key's record and waiter registration.
pub(crate) struct KeyWatch {
    stream: etcd_client::WatchStream,
    /// A change came while the watches were being created.
    pending: bool,
    stale: bool,
}

impl std::fmt::Debug for KeyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyWatch")
            .field("stale", &self.stale)
            .finish_non_exhaustive()
    }
}

impl KeyWatch {
    /// Watches `names` (each a key, or with `true` every key under that prefix) from now on;
    /// answers once etcd has created every watch, so that no change after this returns is
    /// missed.
    pub(crate) async fn open(
        client: &etcd_client::Client,
        names: &[(&str, bool)],
        described: &str,
        timeout: Duration,
    ) -> Result<Self> {
        let options = |prefix: bool| prefix.then(|| etcd_client::WatchOptions::new().with_prefix());
        let Some((&(first, prefix), rest)) = names.split_first() else {
            return Err(crate::error::Error::unavailable(
                described,
                "nothing to watch",
            ));
        };
        let mut stream = retried(described, timeout, || {
            let mut client = client.clone();
            async move { client.watch(first, options(prefix)).await }
        })
        .await?;
        for &(name, prefix) in rest {
            stream
                .watch(name, options(prefix))
                .await
                .map_err(|e| map_err(described, e))?;
        }
        let mut pending = false;
        let mut created = 0;
        while created < names.len() {
            match bounded(described, timeout, stream.message()).await? {
                Some(r) if r.canceled() => {
                    return Err(crate::error::Error::unavailable(
                        described,
                        format!("watch refused: {}", r.cancel_reason()),
                    ))
                }
                Some(r) => {
                    created += usize::from(r.created());
                    pending |= !r.events().is_empty();
                }
                None => {
                    return Err(crate::error::Error::unavailable(
                        described,
                        "the watch stream ended",
                    ))
                }
            }
        }
        Ok(KeyWatch {
            stream,
            pending,
            stale: false,
        })
    }
}

#[async_trait]
impl ChangeWatch for KeyWatch {
    async fn changed(&mut self) {
        if std::mem::take(&mut self.pending) {
            return;
        }
        if self.stale {
            return std::future::pending().await;
        }
        loop {
            match self.stream.message().await {
                Ok(Some(r)) if r.canceled() => break,
                Ok(Some(r)) if !r.events().is_empty() => return,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.stale = true;
    }

    fn stale(&self) -> bool {
        self.stale
    }
}
