//! The Redis store's floor ([`crate::floor`]), the **fenced floor**: one script that `INCR`s the
//! key's fence counter and sets the record key `token:fence` with `SET NX PX`, and a release by a
//! compare-and-delete script, through the store's own link (its connection, its timeout, its
//! Sentinel or Cluster routing; on a cluster the two keys share the key's hash tag, as the
//! store's do). The least any fenced lock on one Redis costs: no free check, no server time, no
//! JSON, no waiter line (a failed attempt burns a fence, the value says nothing of its holder).
//! Redlock's floor is this one on each node, a majority granting.

use super::RedisStore;
use crate::error::Result;
use crate::floor::{Floor, Taken, TTL};
use crate::key::Key;
use async_trait::async_trait;
use std::sync::{Arc, LazyLock};

/// `INCR` of `KEYS[2]`, then `SET KEYS[1] ARGV[1]:fence NX PX ARGV[2]`: the fence, or 0 when
/// the key is taken.
static FENCED: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        "local f = redis.call('INCR', KEYS[2]) \
         if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. f, 'NX', 'PX', ARGV[2]) then return f end \
         return 0",
    )
});

/// Deletes `KEYS[1]` if it still holds `ARGV[1]`.
static COMPARE_AND_DELETE: LazyLock<::redis::Script> = LazyLock::new(|| {
    ::redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end \
         return 0",
    )
});

/// The fenced floor of one Redis store.
#[derive(Debug)]
pub(crate) struct RedisFloor(pub(crate) RedisStore);

impl RedisFloor {
    /// The fenced take on this node: the value set (`token:fence`), or `None` when taken.
    pub(crate) async fn take_as(&self, key: &Key, token: &str) -> Result<Option<String>> {
        let (record, fence) = (self.0.record_key(key), self.0.fence_key(key));
        let (record, fence) = (&record, &fence);
        let ttl = TTL.as_millis() as u64;
        let got: i64 = self
            .0
            .inner
            .link
            .send(|mut conn| async move {
                FENCED
                    .key(record)
                    .key(fence)
                    .arg(token)
                    .arg(ttl)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok((got > 0).then(|| format!("{token}:{got}")))
    }

    /// The compare-and-delete of `value` on this node.
    pub(crate) async fn release_value(&self, key: &Key, value: &str) -> Result<()> {
        let record = &self.0.record_key(key);
        let _: i64 = self
            .0
            .inner
            .link
            .send(|mut conn| async move {
                COMPARE_AND_DELETE
                    .key(record)
                    .arg(value)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(())
    }
}

#[async_trait]
impl Floor for RedisFloor {
    fn describe(&self) -> String {
        "INCR + SET NX PX (one script), compare-and-delete (one script)".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let token = crate::holder::new_token();
        Ok(self.take_as(key, &token).await?.map(Taken::new))
    }

    async fn release(&self, key: &Key, taken: Taken) -> Result<()> {
        self.release_value(key, taken.as_str()).await
    }
}

impl RedisStore {
    /// The store's fenced floor.
    pub(crate) fn fenced_floor(&self) -> Arc<RedisFloor> {
        Arc::new(RedisFloor(self.clone()))
    }
}
