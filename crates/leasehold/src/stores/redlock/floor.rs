//! The Redlock store's floor ([`crate::floor`]): the Redis store's fenced floor on every node at
//! once (`INCR` + `SET NX PX` in one script, a compare-and-delete script), taken when a majority
//! granted, released on every node that granted; each node through its store's own connection
//! and bounded by the per-node timeout, as the store's calls are. No fence agreement, no
//! validity check, no raising of lagging counters.

use super::RedlockStore;
use crate::error::Result;
use crate::floor::{Floor, Taken};
use crate::key::Key;
use crate::stores::redis::floor::RedisFloor;
use async_trait::async_trait;
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::Duration;

/// The fenced floor on each node, a majority granting.
#[derive(Debug)]
pub(super) struct RedlockFloor {
    nodes: Vec<Arc<RedisFloor>>,
    quorum: usize,
    timeout: Duration,
    described: String,
}

impl RedlockFloor {
    pub(super) fn new(store: &RedlockStore) -> Self {
        RedlockFloor {
            nodes: store.nodes.iter().map(|(_, n)| n.fenced_floor()).collect(),
            quorum: store.quorum,
            timeout: store.timeout,
            described: store.described.clone(),
        }
    }

    /// Releases the values each node was given (`None`: not granted there).
    async fn release_values(&self, key: &Key, values: &[Option<String>]) -> Result<()> {
        let calls = self
            .nodes
            .iter()
            .zip(values)
            .map(|(node, value)| async move {
                match value {
                    Some(v) => tokio::time::timeout(self.timeout, node.release_value(key, v))
                        .await
                        .unwrap_or_else(|_| Err(crate::error::Error::no_answer(&self.described))),
                    None => Ok(()),
                }
            });
        // A node that did not answer keeps its value until its PX: the majority released it.
        let answers = join_all(calls).await;
        let released = answers.iter().filter(|r| r.is_ok()).count();
        match answers.into_iter().find_map(|r| r.err()) {
            Some(e) if released < self.quorum => Err(e),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl Floor for RedlockFloor {
    fn describe(&self) -> String {
        "INCR + SET NX PX (one script) on every node, a majority granting; compare-and-delete on each".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let token = crate::holder::new_token();
        let calls = self.nodes.iter().map(|node| {
            let token = &token;
            async move {
                tokio::time::timeout(self.timeout, node.take_as(key, token))
                    .await
                    .unwrap_or_else(|_| Err(crate::error::Error::no_answer(&self.described)))
            }
        });
        let mut values = vec![];
        let (mut failed, mut failures) = (None, 0);
        for answer in join_all(calls).await {
            match answer {
                Ok(v) => values.push(v),
                Err(e) => {
                    values.push(None);
                    failures += 1;
                    failed = failed.or(Some(e));
                }
            }
        }
        let granted = values.iter().filter(|v| v.is_some()).count();
        if granted >= self.quorum {
            // One value per node, in the nodes' order (empty: not granted there).
            let joined: Vec<&str> = values.iter().map(|v| v.as_deref().unwrap_or("")).collect();
            return Ok(Some(Taken::new(joined.join("\n"))));
        }
        self.release_values(key, &values).await?;
        // Too few nodes answered to tell "taken" from "down".
        match failed {
            Some(e) if values.len() - failures < self.quorum => Err(e),
            _ => Ok(None),
        }
    }

    async fn release(&self, key: &Key, taken: Taken) -> Result<()> {
        let values: Vec<Option<String>> = taken
            .as_str()
            .split('\n')
            .map(|v| (!v.is_empty()).then(|| v.to_owned()))
            .collect();
        self.release_values(key, &values).await
    }
}
