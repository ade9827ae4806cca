//! The Google Cloud Storage store: one JSON object per key in a bucket, every write conditioned on
//! the object's generation.
//!
//! Checklist: native TTL no (expiry is judged by [`crate::adapter`]'s observation rule); watch no
//! (waiters poll with capped backoff and jitter); liveness no; fences: a counter in the object,
//! each grant's floored at the acquirer's wall clock in microseconds, and at the fence
//! high-water mark for an object created again after `cleanup` (GCS generations are not
//! promised to grow across a deletion, so they are not used as revisions).
//!
//! A [`RecordStore`]: [`crate::adapter::RecordLockStore`] over it (as `open_store("gs://…")`
//! builds) is the lock store. Every write is a multipart upload to the JSON API with
//! `ifGenerationMatch=0` (create) or `=<generation read>` (replace); a release is a conditional
//! replace with a free record (it keeps the fence), and objects are deleted only by `cleanup`,
//! with `ifGenerationMatch` too.
//!
//! The object is JSON **in the single-waiter GCS lock service's schema** (`ownerId`, `expiresAt` in Unix
//! seconds, `waitingOwnerId`, `waiterExpiresAt`) with leasehold's record beside it under
//! `leasehold`; a process of that service and a leasehold process exclude each other:
//! * an object that service wrote carries no TTL: it reads as held by its `ownerId` until it has
//!   been seen unchanged for `foreign_ttl` (that service's lease length, default 60 s), or its
//!   `expiresAt` has passed by more than `max_clock_skew`; its waiter registration is honoured as
//!   a reservation, and lapses the same way;
//! * the `expiresAt` leasehold writes is its lease's expiry plus `max_clock_skew`: that service
//!   judges it on its own wall clock with no margin, so a clock of that service's up to
//!   `max_clock_skew` ahead still sees the lease held until leasehold's holder has stopped;
//! * that service rewrites the object with its four fields only (its waiter registration, its
//!   renewals): a lease or waiter registration of leasehold's it copied as it was (same
//!   `ownerId` and `expiresAt`, same waiter and waiter expiry) is still leasehold's, as this
//!   process last read or wrote it, so its holder sees the waiter and hands off.
//!
//! URL: `gs://BUCKET/PREFIX[?endpoint=…&timeout=…&foreign_ttl=…&max_clock_skew=…]` (also
//! `gcs://`). The object of key `K` is `PREFIX/K` (a key longer than the name limit, `.`, `..`,
//! or one that looks like a hashed name is shortened and given 128 bits of its SHA-256). Credentials come from Google's
//! chain (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's application default credentials, the metadata
//! server, `gcloud auth print-access-token`), through the `gcp_auth` crate. With
//! `STORAGE_EMULATOR_HOST=host:port` (as Google's client libraries read it) or `?endpoint=URL`
//! the store talks to that emulator without credentials.
//!
//! ```no_run
//! # async fn f() -> leasehold::Result<()> {
//! let locks = leasehold::connect("gs://my-bucket/locks").await?;
//! let guard = locks.lock("nightly-report")?.acquire().await?;
//! // gcloud storage cat gs://my-bucket/locks/nightly-report  shows the lease
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod client;
mod floor;
pub(crate) mod object;
mod options;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{Capabilities, RecordStore, Stored};
use crate::stores::object::{LABEL_LIMIT, MAX_RECORD_BYTES};
use async_trait::async_trait;
use client::{Auth, Client, Read};
pub use options::GcsOptions;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// The lease length leasehold assumes for a lease another client of the object holds (the
/// single-waiter lock service's own: 60 s) unless `?foreign_ttl=` says otherwise.
pub const DEFAULT_FOREIGN_TTL: Duration = Duration::from_secs(60);

/// The endpoint of Google Cloud Storage's JSON API.
pub const GOOGLE_ENDPOINT: &str = "https://storage.googleapis.com";

/// The environment variable Google's client libraries read for an emulator's `host:port`.
pub const EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";

/// The longest object name GCS accepts, in bytes.
const MAX_NAME: usize = 1024;

/// Hex digits of SHA-256 in a shortened object name.
const HASH_HEX: usize = 32;

/// An object as last read or written: its generation and its JSON.
type Seen = (String, Map<String, Value>);

/// A [`RecordStore`] over objects in a Google Cloud Storage bucket; wrap it in
/// [`crate::adapter::RecordLockStore`] (as `open_store("gs://…")` does) for a lock store.
pub struct GcsStore {
    client: std::sync::Arc<Client>,
    bucket: String,
    /// The name prefix with its `/` (empty for none).
    prefix: String,
    describe: String,
    /// Object name → (generation, object) as last read or written, so that a replace of that
    /// generation keeps the fields leasehold does not own, and another client's lease exactly.
    seen: Mutex<HashMap<String, Seen>>,
    /// [`GcsOptions::foreign_ttl`] in milliseconds.
    foreign_ttl_ms: u64,
    /// [`GcsOptions::max_clock_skew`] in milliseconds: the `expiresAt` margin.
    margin_ms: u64,
}

impl fmt::Debug for GcsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcsStore")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

impl GcsStore {
    /// Connects with `options`: the store of records; [`crate::adapter::RecordLockStore`] over
    /// it (with the same `max_clock_skew`) is the lock store, as `open_store("gs://…")` makes it.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a bad bucket, prefix, endpoint or timeout;
    /// [`Error::Store`], not retryable, when no Google credentials can be found (and no
    /// emulator is named); [`Error::Unavailable`] when the credential chain did not answer
    /// within the timeout (the metadata server, say).
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::{adapter::RecordLockStore, stores::gcs::{GcsOptions, GcsStore}, Locks};
    /// let o = GcsOptions::from_url("gs://my-bucket/locks?timeout=5s")?;
    /// let skew = o.max_clock_skew;
    /// let store = RecordLockStore::new(GcsStore::connect(o).await?).with_max_clock_skew(skew);
    /// let locks = Locks::new(store);
    /// # drop(locks); Ok(()) }
    /// ```
    pub async fn connect(options: GcsOptions) -> Result<Self> {
        options.check()?;
        let prefix = options.prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        let emulator = std::env::var(EMULATOR_ENV).ok().filter(|h| !h.is_empty());
        // An endpoint named by the option or the variable is an emulator: no credentials.
        let (endpoint, via, anonymous) = match (&options.endpoint, emulator) {
            (Some(e), _) => (e.clone(), format!("?endpoint={e}"), true),
            (None, Some(host)) => {
                let e = if host.contains("://") {
                    host
                } else {
                    format!("http://{host}")
                };
                (e, format!(" ({EMULATOR_ENV})"), true)
            }
            (None, None) => (GOOGLE_ENDPOINT.to_owned(), String::new(), false),
        };
        options::check_endpoint(&endpoint)?;
        let describe = format!("gs://{}/{prefix}{via}", options.bucket);
        /// What a user without credentials can do.
        const CREDENTIALS_HELP: &str =
            "set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, \
            run `gcloud auth application-default login`, or run where the metadata server answers \
            (LEASEHOLD_LOG=debug shows what each source said)";
        let auth = if !anonymous {
            let provider = tokio::time::timeout(options.timeout, gcp_auth::provider()).await;
            let unavailable = |detail: String| Error::Unavailable {
                store: describe.clone(),
                detail,
                source: None,
            };
            match provider {
                Ok(Ok(p)) => Auth::Google(p),
                // Every source of the chain answered, none with a credential: trying again
                // finds none either, until the environment changes.
                Ok(Err(e)) => {
                    tracing::debug!(store = %describe, error = %e, "no source of Google credentials answered with one");
                    return Err(Error::Store {
                        store: describe.clone(),
                        detail: format!("no Google credentials found: {CREDENTIALS_HELP}"),
                        retryable: false,
                        source: None,
                    });
                }
                Err(_) => return Err(unavailable(format!(
                    "no Google credentials within {:?} (the metadata server did not answer): {CREDENTIALS_HELP}",
                    options.timeout
                ))),
            }
        } else {
            Auth::Anonymous
        };
        let client = Client::new(
            endpoint,
            options.bucket.clone(),
            auth,
            options.timeout,
            describe.clone(),
        )?;
        Ok(GcsStore {
            client: std::sync::Arc::new(client),
            bucket: options.bucket,
            prefix,
            describe,
            seen: Mutex::new(HashMap::new()),
            foreign_ttl_ms: crate::record::ms(options.foreign_ttl),
            margin_ms: crate::record::ms(options.max_clock_skew),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// How many HTTP requests this store has sent (for measurements).
    pub fn requests(&self) -> u64 {
        self.client.requests()
    }

    /// The name of `key`'s object: the prefix and the key as it is, unless the name would be
    /// longer than GCS allows (1024 bytes), is `.` or `..` after the prefix, or ends like a
    /// shortened name; then a readable start of the key, `--` and 32 hex digits of its SHA-256.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::gcs::{GcsOptions, GcsStore}, Key};
    /// let mut o = GcsOptions::new("my-bucket");
    /// (o.prefix, o.endpoint) = ("locks".into(), Some("http://127.0.0.1:9".into()));
    /// let store = GcsStore::connect(o).await?;
    /// assert_eq!(store.object_name(&Key::new("job:1/a b")?), "locks/job:1/a b");
    /// assert!(store.object_name(&Key::new("..")?).starts_with("locks/--"));
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn object_name(&self, key: &Key) -> String {
        object_name(&self.prefix, key)
    }

    /// The key an object of another client names (its name after the prefix).
    fn key_of(&self, name: &str) -> String {
        name.strip_prefix(&self.prefix).unwrap_or(name).to_owned()
    }

    fn remember(&self, name: &str, generation: &str, map: Map<String, Value>) {
        let mut seen = self.seen.lock();
        if seen.len() > 4096 {
            seen.clear();
        }
        seen.insert(name.to_owned(), (generation.to_owned(), map));
    }

    /// The object of `record`, replacing `version` (`None`: a create), and its bytes.
    fn object(
        &self,
        name: &str,
        record: &LeaseRecord,
        version: Option<&str>,
    ) -> Result<(Map<String, Value>, Vec<u8>)> {
        let base = version.and_then(|v| {
            self.seen
                .lock()
                .get(name)
                .filter(|(g, _)| g == v)
                .map(|(_, m)| m.clone())
        });
        let map = object::encode(record, base, self.margin_ms);
        let bytes = serde_json::to_vec_pretty(&map).unwrap_or_default();
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(Error::option(
                "labels",
                format!(
                    "the lease object of {:?} would be {} bytes; the gs:// store reads objects of at most {MAX_RECORD_BYTES} bytes (1 MiB): use fewer or shorter labels",
                    record.key,
                    bytes.len()
                ),
            ));
        }
        Ok((map, bytes))
    }

    async fn read(&self, name: &str, key: &str) -> Result<Option<Stored>> {
        Ok(self.read_dated(name, key).await?.map(|(s, _)| s))
    }

    /// [`Self::read`] with the object's server age.
    async fn read_dated(
        &self,
        name: &str,
        key: &str,
    ) -> Result<Option<(Stored, Option<Duration>)>> {
        let (read, age) = self.client.get(name).await?;
        Ok(match read {
            Read::Missing => None,
            Read::TooLarge(version, n) => Some(Stored::Corrupt {
                version,
                detail: format!(
                    "object gs://{}/{name} is {n} bytes, more than the {MAX_RECORD_BYTES} this store reads",
                    self.bucket
                ),
                salvaged_fence: None,
            }),
            Read::Found(bytes, version) => {
                let decoded = object::parse(&bytes).and_then(|mut map| {
                    // The other service rewrites the object with its four fields only: what our
                    // field said of the lease and waiter it copied as they were still holds.
                    if let Some((_, previous)) = self.seen.lock().get(name) {
                        object::adopt(&mut map, previous);
                    }
                    object::decode(&map, key, self.foreign_ttl_ms).map(|r| (map, r))
                });
                match decoded {
                    Ok((map, record)) => {
                        self.remember(name, &version, map);
                        Some(Stored::Record { record, version })
                    }
                    Err(d) => Some(Stored::Corrupt {
                        version,
                        detail: d.detail,
                        salvaged_fence: d.fence,
                    }),
                }
            }
        }
        .map(|stored| (stored, age)))
    }
}

/// The object name of `key` under `prefix` ([`GcsStore::object_name`]).
pub(crate) fn object_name(prefix: &str, key: &Key) -> String {
    let k = key.as_str();
    let room = MAX_NAME - prefix.len();
    let fits = k.len() <= room && k != "." && k != ".." && !looks_hashed(k) && !k.ends_with('/');
    if fits {
        return format!("{prefix}{k}");
    }
    let digest = Sha256::digest(k.as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let mut readable = String::new();
    for c in k.chars() {
        if readable.len() + c.len_utf8() > room - 2 - HASH_HEX {
            break;
        }
        readable.push(c);
    }
    let readable = readable.trim_end_matches(['.', '/']);
    format!("{}{readable}--{}", prefix, &hash[..HASH_HEX])
}

/// Whether `s` ends like a shortened name (`--` and [`HASH_HEX`] hex digits): such a key is
/// shortened too, so it cannot take another key's name.
fn looks_hashed(s: &str) -> bool {
    let n = HASH_HEX + 2;
    s.len() >= n
        && s.is_char_boundary(s.len() - n)
        && s[s.len() - n..].starts_with("--")
        && s[s.len() - HASH_HEX..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[async_trait]
impl RecordStore for GcsStore {
    fn label_limit(&self) -> usize {
        LABEL_LIMIT
    }

    fn floor(&self) -> Option<std::sync::Arc<dyn crate::floor::Floor>> {
        Some(std::sync::Arc::new(floor::GcsFloor::new(self)))
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: false,
            liveness: false,
            fence_source:
                "a counter in the object, floored at the acquirer's wall clock in microseconds and, after cleanup, at the fence high-water mark",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::ServerDates,
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Stored>> {
        self.read(&self.object_name(key), key.as_str()).await
    }

    async fn get_dated(&self, key: &Key) -> Result<Option<(Stored, Option<Duration>)>> {
        self.read_dated(&self.object_name(key), key.as_str()).await
    }

    fn server_clock(&self) -> bool {
        true
    }

    async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
        let name = self.object_name(key);
        let (map, bytes) = self.object(&name, record, None)?;
        let written = self.client.put(&name, &bytes, "0").await?;
        if let Some(g) = &written {
            self.remember(&name, g, map);
        }
        Ok(written)
    }

    async fn replace(
        &self,
        key: &Key,
        record: &LeaseRecord,
        version: &str,
    ) -> Result<Option<String>> {
        let name = self.object_name(key);
        let (map, bytes) = self.object(&name, record, Some(version))?;
        let written = self.client.put(&name, &bytes, version).await?;
        if let Some(g) = &written {
            self.remember(&name, g, map);
        }
        Ok(written)
    }

    async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        let name = self.object_name(key);
        let deleted = self.client.delete(&name, version).await?;
        if deleted {
            self.seen.lock().remove(&name);
        }
        Ok(deleted)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        let all = self.list_dated(prefix).await?;
        Ok(all.into_iter().map(|(n, s, _)| (n, s)).collect())
    }

    async fn list_dated(&self, prefix: &str) -> Result<Vec<(String, Stored, Option<Duration>)>> {
        // A shortened name starts with the key's first bytes, up to its readable part's length.
        let room = MAX_NAME - self.prefix.len() - 2 - HASH_HEX;
        let mut cut = prefix.len().min(room);
        while !prefix.is_char_boundary(cut) {
            cut -= 1;
        }
        let names = self
            .client
            .list(&format!("{}{}", self.prefix, &prefix[..cut]))
            .await?;
        let mut out = Vec::new();
        for name in names {
            let key = self.key_of(&name);
            let Some((s, age)) = self.read_dated(&name, &key).await? else {
                continue; // deleted since it was listed
            };
            let matches = match &s {
                Stored::Record { record, .. } => record.key.starts_with(prefix),
                Stored::Corrupt { .. } => key.starts_with(prefix),
            };
            if matches {
                out.push((name, s, age));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}
