//! The PostgreSQL store's floor ([`crate::floor`]), the **fenced floor**: one prepared upsert
//! into the store's own table that takes a free or expired row (expiry judged by the server's
//! `now()`) and writes the columns an operator reads of a lease (holder, token, a fence from the
//! store's sequence, acquired, renewed, expires, ttl_ms, pid, host, labels), returning the
//! fence; and one prepared `UPDATE` that frees the row and keeps it (token and holder set to
//! null). Both on the store's shared connection, bounded by its timeout. No waiter, no permits,
//! no notification, no row version check.

use super::Inner;
use crate::error::Result;
use crate::floor::{Floor, Taken, TTL};
use crate::key::Key;
use async_trait::async_trait;
use std::sync::Arc;

/// The take: `$1` key, `$2` holder, `$3` token, `$4` TTL in ms, `$5` pid, `$6` host, `$7` labels.
const TAKE: &str = "INSERT INTO {table} AS t (key, holder, token, fence, acquired, renewed, \
     expires, ttl_ms, pid, host, labels) \
     VALUES ($1, $2, $3, nextval('{sequence}'::regclass), now(), now(), \
     now() + $4::bigint * interval '1 millisecond', $4::bigint, $5::integer, $6, $7) \
     ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, token = excluded.token, \
     fence = nextval('{sequence}'::regclass), acquired = now(), renewed = now(), \
     expires = excluded.expires, ttl_ms = excluded.ttl_ms, pid = excluded.pid, \
     host = excluded.host, labels = excluded.labels \
     WHERE t.token IS NULL OR t.expires <= now() \
     RETURNING fence";

/// The release: `$1` key, `$2` token.
const RELEASE: &str = "UPDATE {table} SET holder = NULL, token = NULL, renewed = now() \
     WHERE key = $1 AND token = $2";

/// The fenced floor of one PostgreSQL store.
#[derive(Debug)]
pub(super) struct PostgresFloor {
    inner: Arc<Inner>,
    take: String,
    release: String,
    holder: String,
    host: String,
}

impl PostgresFloor {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        let fill = |text: &str| {
            text.replace("{table}", &inner.sql.table)
                .replace("{sequence}", &inner.sql.sequence.replace('\'', "''"))
        };
        let host = crate::holder::host();
        PostgresFloor {
            take: fill(TAKE),
            release: fill(RELEASE),
            holder: format!("{host}-{}-floor", crate::holder::pid()),
            host: host.to_owned(),
            inner,
        }
    }
}

#[async_trait]
impl Floor for PostgresFloor {
    fn describe(&self) -> String {
        "fenced upsert of the store's row (expiry by now()), UPDATE freeing it; prepared".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let token = crate::holder::new_token();
        let ttl = TTL.as_millis() as i64;
        let pid = i32::try_from(crate::holder::pid()).unwrap_or(0);
        let rows = self
            .inner
            .query(
                &self.take,
                &[
                    &key.as_str(),
                    &self.holder,
                    &token,
                    &ttl,
                    &pid,
                    &self.host,
                    &"{}",
                ],
            )
            .await?;
        Ok((!rows.is_empty()).then(|| Taken::new(token)))
    }

    async fn release(&self, key: &Key, taken: Taken) -> Result<()> {
        self.inner
            .query(&self.release, &[&key.as_str(), &taken.as_str()])
            .await?;
        Ok(())
    }
}
