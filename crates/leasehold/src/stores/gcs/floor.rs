//! The GCS store's floor ([`crate::floor`]), through the store's own JSON API client (its HTTP
//! transport, token and timeout, and its request count): uncontended, a conditional create
//! (`ifGenerationMatch=0`, one multipart upload) of a small object and its delete on that
//! generation; contended, a read, then that create when the read found no object, and the same
//! delete. No record, no fence, no waiter line.

use super::client::{Client, Read};
use super::GcsStore;
use crate::error::Result;
use crate::floor::{not_free, Floor, Taken};
use crate::key::Key;
use async_trait::async_trait;
use std::sync::Arc;

/// The raw floor of one GCS store.
#[derive(Debug)]
pub(super) struct GcsFloor {
    client: Arc<Client>,
    prefix: String,
}

impl GcsFloor {
    pub(super) fn new(store: &GcsStore) -> Self {
        GcsFloor {
            client: store.client.clone(),
            prefix: store.prefix.clone(),
        }
    }

    /// The floor's object of `key`: the record's name and `.floor`.
    fn name(&self, key: &Key) -> String {
        format!("{}.floor", super::object_name(&self.prefix, key))
    }

    /// The conditional create: the new generation, or `None` when the object is there.
    async fn create(&self, name: &str) -> Result<Option<String>> {
        let body = format!("{{\"token\":\"{}\"}}", crate::holder::new_token());
        self.client.put(name, body.as_bytes(), "0").await
    }
}

#[async_trait]
impl Floor for GcsFloor {
    fn describe(&self) -> String {
        "conditional create (ifGenerationMatch=0), delete on its generation; contended, a read first".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let name = self.name(key);
        match self.client.get(&name).await?.0 {
            Read::Missing => Ok(self.create(&name).await?.map(Taken::new)),
            Read::Found(..) | Read::TooLarge(..) => Ok(None),
        }
    }

    async fn release(&self, key: &Key, taken: Taken) -> Result<()> {
        self.client.delete(&self.name(key), taken.as_str()).await?;
        Ok(())
    }

    async fn cycle(&self, key: &Key) -> Result<()> {
        let name = self.name(key);
        match self.create(&name).await? {
            Some(generation) => self.release(key, Taken::new(generation)).await,
            None => Err(not_free(&self.describe(), key)),
        }
    }

    fn requests(&self) -> Option<u64> {
        Some(self.client.requests())
    }
}
