//! The file store's floor ([`crate::floor`]): a file created if absent (`open(O_CREAT|O_EXCL)`)
//! and closed, then unlinked: the least a lock made of files costs, without the record the
//! store writes, its OFD locks and its clock. The floor's files are `NAME.floor` beside the
//! records (`NAME.lease`), which the store's listing and `cleanup` leave alone.

use super::Inner;
use crate::error::{Error, Result};
use crate::floor::{Floor, Taken};
use crate::key::Key;
use async_trait::async_trait;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The file store's floor, over the store's directory and naming.
#[derive(Debug)]
pub(super) struct FileFloor(pub(super) Arc<Inner>);

impl FileFloor {
    fn path(&self, key: &Key) -> PathBuf {
        let mut name = self.0.naming.name(key);
        name.push_str(".floor");
        self.0.dir.join(name)
    }
}

#[async_trait]
impl Floor for FileFloor {
    fn describe(&self) -> String {
        "open(O_CREAT|O_EXCL) + close, unlink".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let path = self.path(key);
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(self.0.opts.mode)
            .open(&path);
        match created {
            Ok(file) => {
                drop(file);
                Ok(Some(Taken::new(path.display().to_string())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(Error::io("open", path.display(), e)),
        }
    }

    async fn release(&self, key: &Key, _taken: Taken) -> Result<()> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("unlink", path.display(), e)),
        }
    }
}
