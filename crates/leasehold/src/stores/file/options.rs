//! The file store's options ([`FileOptions`]) and its URL, `file:///path/to/dir[?mode=…&fsync=…]`
//! ([`FileUrl`]).

use super::FileStore;
use crate::error::Result;
use crate::store::LockStore;
use crate::url::Params;
use std::path::PathBuf;
use std::sync::Arc;

/// Options of the file store; the `mode` and `fsync` parameters of a `file://` URL.
///
/// ```
/// use leasehold::stores::file::{FileOptions, FileStore};
/// let dir = tempfile::tempdir().unwrap();
/// // Group may read; fdatasync each write.
/// let shared = FileOptions::default().with_mode(0o640).with_fsync(true);
/// assert!(FileStore::open(dir.path(), shared).is_ok());
/// let unreadable = FileOptions::default().with_mode(0o200);
/// assert!(FileStore::open(dir.path(), unreadable).is_err(), "must include 0600");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FileOptions {
    /// Mode of created record files (default 0o600, `?mode=0640`, octal).
    pub mode: u32,
    /// `fdatasync` after every record write (default false, `?fsync=true`).
    pub fsync: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            mode: crate::fsmode::DEFAULT,
            fsync: false,
        }
    }
}

impl FileOptions {
    /// These options with record files of mode `mode` ([`FileOptions::mode`]).
    #[must_use]
    pub fn with_mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// These options with `fdatasync` after every record write, or not ([`FileOptions::fsync`]).
    #[must_use]
    pub fn with_fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }
}

/// What a `file://` URL names: the directory and the options of its query.
#[derive(Debug)]
pub(crate) struct FileUrl {
    /// The store's directory.
    pub(crate) dir: PathBuf,
    /// The options of the query.
    pub(crate) options: FileOptions,
}

impl crate::store::StoreOptions for FileUrl {
    /// Parses a `file://` URL: the directory, and the query's `mode` (octal) and `fsync`
    /// (`true`/`false`).
    fn from_url(url: &str) -> Result<Self> {
        let parsed = crate::url::parse(url)?;
        let mut params = Params::new(&parsed);
        if !matches!(parsed.host_str(), None | Some("") | Some("localhost")) {
            return Err(
                params.invalid("a file:// URL names a local directory: file:///path/to/dir")
            );
        }
        let dir = parsed
            .to_file_path()
            .map_err(|()| params.invalid("not an absolute directory path"))?;
        let mut options = FileOptions::default();
        if let Some(v) = params.take_str("mode") {
            options.mode = u32::from_str_radix(&v, 8)
                .map_err(|_| params.invalid(format!("mode {v:?} is not octal")))?;
        }
        if let Some(fsync) = params.take_bool("fsync")? {
            options.fsync = fsync;
        }
        params.finish()?;
        Ok(FileUrl { dir, options })
    }

    async fn connect(self) -> Result<Arc<dyn LockStore>> {
        Ok(Arc::new(FileStore::open(self.dir, self.options)?))
    }
}
