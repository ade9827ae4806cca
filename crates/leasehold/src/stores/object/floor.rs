//! The S3 and Azure stores' floor ([`crate::floor`]), through the store's own HTTP transport
//! (its pool, signing and timeout, and its request count): uncontended, a conditional create
//! (`If-None-Match: *`) of a small object and its conditional delete (`If-Match` its ETag);
//! contended, a read, then that create when the read found no object, and the same delete. No
//! record, no fence, no waiter line.

use super::objects::{Backend, Objects, Precondition};
use crate::error::Result;
use crate::floor::{not_free, Floor, Taken};
use crate::key::Key;
use async_trait::async_trait;
use std::sync::Arc;

/// The raw floor of one object store.
#[derive(Debug)]
pub(crate) struct ObjectFloor<B>(pub(crate) Arc<Objects<B>>);

impl<B: Backend> ObjectFloor<B> {
    /// The floor's object of `key`: the record's name with `.floor` for `.json`, so that the
    /// store's listing never reads it.
    fn name(&self, key: &Key) -> String {
        let name = self.0.object_name(key);
        format!("{}.floor", name.strip_suffix(".json").unwrap_or(&name))
    }

    /// The conditional create: the new ETag, or `None` when the object is there.
    async fn create(&self, name: &str) -> Result<Option<String>> {
        let body = format!("{{\"token\":\"{}\"}}", crate::holder::new_token());
        let put = self
            .0
            .put_raw(name, body.into_bytes().into(), Precondition::Absent)
            .await?;
        Ok(put.etag)
    }
}

#[async_trait]
impl<B: Backend> Floor for ObjectFloor<B> {
    fn describe(&self) -> String {
        "conditional create (If-None-Match: *), conditional delete (If-Match); contended, a read first".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let name = self.name(key);
        let (found, _) = self.0.get_raw(&name).await?;
        if found.is_some() {
            return Ok(None);
        }
        Ok(self.create(&name).await?.map(Taken::new))
    }

    async fn release(&self, key: &Key, taken: Taken) -> Result<()> {
        self.0.delete_raw(&self.name(key), taken.as_str()).await?;
        Ok(())
    }

    async fn cycle(&self, key: &Key) -> Result<()> {
        let name = self.name(key);
        match self.create(&name).await? {
            Some(etag) => self.release(key, Taken::new(etag)).await,
            None => Err(not_free(&self.describe(), key)),
        }
    }

    fn requests(&self) -> Option<u64> {
        Some(self.0.requests())
    }
}
