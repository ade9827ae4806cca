//! Batched renewals: the renewals asked for while one statement runs go together in the next
//! (one `UPDATE … FROM unnest($keys, $tokens, $ttls)`), so a process holding many leases renews
//! them in one statement per period, not one per lease. Permits go in the same batch: the
//! statement renews a lock where its token is in the key's row, and a permit where its token has
//! a permit row (see `sql::Sql::renew`). The statement runs in a task of its own:
//! a caller that stops waiting does not stop the others' renewals.

use super::Inner;
use crate::error::{Error, Result};
use crate::store::RenewOutcome;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::oneshot;

/// How long the first renewal of a batch waits for the others due with it.
const GATHER: std::time::Duration = std::time::Duration::from_millis(2);

/// One renewal waiting for its statement.
struct Pending {
    key: String,
    token: String,
    ttl_ms: i64,
    answer: oneshot::Sender<Result<RenewOutcome>>,
}

/// The renewals waiting, and whether a task is sending them.
#[derive(Default)]
pub(super) struct Batch {
    state: Mutex<(Vec<Pending>, bool)>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("Batch")
            .field("waiting", &state.0.len())
            .field("sending", &state.1)
            .finish()
    }
}

/// Renews `key` held under `token` for `ttl_ms`, in the next batch.
pub(super) async fn renew(
    inner: &Arc<Inner>,
    key: String,
    token: String,
    ttl_ms: i64,
) -> Result<RenewOutcome> {
    let (answer, rx) = oneshot::channel();
    let start = {
        let mut state = inner.batch.state.lock();
        state.0.push(Pending {
            key,
            token,
            ttl_ms,
            answer,
        });
        !std::mem::replace(&mut state.1, true)
    };
    if start {
        tokio::spawn(send(inner.clone()));
    }
    rx.await
        .unwrap_or_else(|_| Err(Error::no_answer(inner.link.shown())))
}

/// Sends the waiting renewals, batch after batch, until none waits.
async fn send(inner: Arc<Inner>) {
    // Renewals due at the same moment (the guards' renewals are aligned on a grid, each started
    // by a task of its own) join the first: a renewal is due a third of its TTL early, so
    // waiting this long for them costs nothing.
    tokio::time::sleep(GATHER).await;
    loop {
        let batch = {
            let mut state = inner.batch.state.lock();
            if state.0.is_empty() {
                state.1 = false;
                return;
            }
            std::mem::take(&mut state.0)
        };
        let keys: Vec<&str> = batch.iter().map(|p| p.key.as_str()).collect();
        let tokens: Vec<&str> = batch.iter().map(|p| p.token.as_str()).collect();
        let ttls: Vec<i64> = batch.iter().map(|p| p.ttl_ms).collect();
        match inner.renew_many(&keys, &tokens, &ttls).await {
            Ok(outcomes) => {
                for (p, o) in batch.into_iter().zip(outcomes) {
                    let _ = p.answer.send(Ok(o));
                }
            }
            Err(e) => {
                for p in batch {
                    let _ = p.answer.send(Err(e.shared(inner.link.shown())));
                }
            }
        }
    }
}
