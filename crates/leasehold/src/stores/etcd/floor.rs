//! The etcd store's floor ([`crate::floor`]): the raw create-if-absent transaction (compare
//! `create_revision == 0`, put attached to the store's session lease for [`TTL`]) and a delete,
//! through the store's own client, bounded as its calls are. Keys are `<prefix>floor/KEY`, beside
//! the store's `lock/` and `waiter/` keys. No record, no waiter key, no fence agreement (the
//! create revision is the fence, as the store's is).

use super::EtcdStore;
use crate::error::Result;
use crate::floor::{Floor, Taken, TTL};
use crate::key::Key;
use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

/// The raw floor of one etcd store.
#[derive(Debug)]
pub(super) struct EtcdFloor(pub(super) EtcdStore);

impl EtcdFloor {
    fn name(&self, key: &Key) -> String {
        let locks = &self.0.inner.locks;
        let prefix = locks.strip_suffix("lock/").unwrap_or(locks);
        format!("{prefix}floor/{}", key.as_str())
    }
}

#[async_trait]
impl Floor for EtcdFloor {
    fn describe(&self) -> String {
        "txn create if create_revision == 0 (put with a lease), delete".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let session = self.0.inner.sessions.for_ttl(TTL).await?;
        let name = self.name(key);
        let token = crate::holder::new_token();
        let txn = Txn::new()
            .when([Compare::create_revision(name.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                name,
                token.clone(),
                Some(PutOptions::new().with_lease(session.id)),
            )]);
        let done = self.0.txn(txn).await?;
        Ok(done.succeeded().then(|| Taken::new(token)))
    }

    async fn release(&self, key: &Key, _taken: Taken) -> Result<()> {
        let name = self.name(key);
        self.0
            .call(|mut c| {
                let name = name.clone();
                async move { c.delete(name, None).await }
            })
            .await?;
        Ok(())
    }
}
