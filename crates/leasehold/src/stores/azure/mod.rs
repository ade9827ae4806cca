//! Azure Blob Storage store: `az://CONTAINER[/PREFIX][?account=…&endpoint=…&timeout=…]` (or
//! `azure://`).
//!
//! Checklist:
//! - **records**: one block blob per key, `PREFIX/NAME.json` (NAME: the key's file-safe name);
//!   the record plus a `write` nonce, so every write changes the ETag ([`crate::stores::object`]);
//! - **writes**: Put Blob with `If-None-Match: *` to create (409 `BlobAlreadyExists` when it
//!   exists), `If-Match: <ETag>` to replace (412 when stale); Delete Blob with `If-Match` (only
//!   `cleanup` deletes: a release is a conditional replace that frees the record and keeps its
//!   fence). A failed precondition is a lost race, never an error;
//! - **why not Azure's blob leases**: a native lease expires on the server (no client clock),
//!   but it lasts 15 to 60 seconds or forever, and nothing else: a 5 s or a 10-minute lease
//!   cannot be expressed, a TTL would have to be rounded, and the lease id it returns is all a
//!   holder has (a crashed holder's infinite lease needs a `break`). It also costs a request of
//!   its own beside the record write (acquire lease, then write under it), and a waiter
//!   registration, a fence and handoff would still need the conditional writes. leasehold uses
//!   the conditional writes alone, so one algorithm ([`crate::adapter`]) serves every
//!   compare-and-set store, and the record's expiry is judged by observation on the reader's
//!   monotonic clock, which needs no synchronised clocks either;
//! - **expiry**: by observation (see [`crate::adapter`]); the skew shortcut takes a record whose
//!   written expiry is older than now − `max_clock_skew`;
//! - **fence**: floored at the writer's wall clock in microseconds, above the previous fence,
//!   and, for an object created again after `cleanup`, at the fence high-water mark;
//! - **watch**: none; waiters poll with capped, jittered backoff;
//! - **credentials**: `AZURE_STORAGE_CONNECTION_STRING` (`AccountName` + `AccountKey`, with
//!   `BlobEndpoint` or `EndpointSuffix`; `UseDevelopmentStorage=true` for the emulator at
//!   `http://127.0.0.1:10000`), else the account (`?account=`, `AZURE_STORAGE_ACCOUNT_NAME` or
//!   `AZURE_STORAGE_ACCOUNT`) and its key (`AZURE_STORAGE_ACCOUNT_KEY` or `AZURE_STORAGE_KEY`),
//!   else `AZURE_STORAGE_USE_EMULATOR=true` (the development account at
//!   `AZURITE_BLOB_STORAGE_URL`, default `http://127.0.0.1:10000`). Requests are signed with
//!   Shared Key. Endpoint: `?endpoint=`, the connection string's, else
//!   `https://ACCOUNT.blob.core.windows.net`; an emulator endpoint carries the account in its
//!   path (`http://127.0.0.1:10000/devstoreaccount1`).
//!
//! The client is leasehold's own, small: `hyper` with rustls, and Shared Key signing written out
//! in its `sharedkey` module (Azurite checks every signature in the tests). The `object_store` crate
//! (Apache Arrow) has no conditional delete, and the Azure SDK crates would bring their own HTTP
//! stack for five request kinds.

mod options;
mod sharedkey;

pub use sharedkey::{AzureCredentials, DEV_ACCOUNT};

pub use options::AzureOptions;

use crate::error::{Error, Result};
use crate::stores::object::sign::{times, uri_encode, ToSign};
use crate::stores::object::transport::Body;
use crate::stores::object::{object_record_store, xml_values, Backend, Call, Objects, Page};
use hyper::Request;
use std::time::SystemTime;

/// The Blob service API version of every request.
const API_VERSION: &str = "2021-08-06";

/// How requests reach the container.
#[derive(Debug)]
struct Azure {
    describe: String,
    credentials: AzureCredentials,
    /// `scheme://host[:port]`.
    origin: String,
    /// The endpoint's path and the container, e.g. `/devstoreaccount1/locks` (encoded).
    container_path: String,
}

impl Backend for Azure {
    fn describe(&self) -> &str {
        &self.describe
    }

    fn request(&self, call: Call) -> Result<Request<Body>> {
        let path = match &call.object {
            Some(name) => format!("{}/{}", self.container_path, uri_encode(name, true)),
            None => self.container_path.clone(),
        };
        let (_, date) = times(SystemTime::now());
        let mut r = ToSign::new(call.method, path);
        r.headers = vec![
            ("x-ms-date".into(), date),
            ("x-ms-version".into(), API_VERSION.into()),
        ];
        r.headers
            .extend(call.headers.into_iter().map(|(k, v)| (k.to_owned(), v)));
        (r.query, r.body) = (call.query, call.body);
        let auth = sharedkey::authorization(&r, &self.credentials)?;
        r.into_request(&self.origin, Some(auth), &self.describe)
    }

    fn put_headers(&self) -> Vec<(&'static str, String)> {
        vec![("x-ms-blob-type", "BlockBlob".into())]
    }

    fn list_query(&self, prefix: &str, next: Option<&str>) -> Vec<(&'static str, String)> {
        let mut q = vec![
            ("restype", "container".to_owned()),
            ("comp", "list".to_owned()),
            ("prefix", prefix.to_owned()),
        ];
        if let Some(n) = next {
            q.push(("marker", n.to_owned()));
        }
        q
    }

    fn parse_list(&self, xml: &str) -> Page {
        Page {
            names: xml_values(xml, "Name"),
            next: xml_values(xml, "NextMarker").into_iter().next(),
        }
    }

    fn denied_hint(&self) -> &'static str {
        "check the account key (or connection string); the key must belong to the account the endpoint names"
    }
}

/// A [`RecordStore`](crate::RecordStore) over block blobs of an Azure Storage container; wrap it
/// in [`crate::adapter::RecordLockStore`] (as `open_store("az://…")` does) for a lock store.
///
/// ```no_run
/// # async fn f() -> leasehold::Result<()> {
/// use leasehold::{adapter::RecordLockStore, stores::azure::{AzureOptions, AzureStore}, Locks};
/// let mut o = AzureOptions::new("locks"); // credentials from AZURE_STORAGE_CONNECTION_STRING
/// o.prefix = "jobs".into();
/// let locks = Locks::new(RecordLockStore::new(AzureStore::connect(o)?));
/// let guard = locks.lock("nightly-report")?.try_acquire().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AzureStore {
    objects: std::sync::Arc<Objects<Azure>>,
}

object_record_store!(AzureStore);

/// An environment variable, if set and not empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A container name Azure accepts: 3–63 of `[a-z0-9-]`, starting and ending alphanumeric.
fn valid_container(c: &str) -> bool {
    (3..=63).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
        && !c.contains("--")
}

impl AzureStore {
    /// Creates the container if it does not exist yet: `true` if this call created it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the service cannot be reached or does not answer in time;
    /// [`Error::Store`] when it refuses (access denied, a bad name).
    pub async fn create_container(&self) -> Result<bool> {
        let call = Call {
            method: hyper::Method::PUT,
            object: None,
            query: vec![("restype", "container".to_owned())],
            headers: vec![],
            body: hyper::body::Bytes::new(),
        };
        let a = self
            .objects
            .send(
                "create container",
                call,
                crate::stores::object::SHORT_ANSWER_BYTES,
            )
            .await?;
        match a.status {
            201 => Ok(true),
            409 => Ok(false),
            _ => Err(self.objects.refused("create container", &a)),
        }
    }

    /// Connects with `options` (no request is sent until the first operation).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a bad container, endpoint or timeout, a malformed
    /// `AZURE_STORAGE_CONNECTION_STRING`, or when no credentials are found.
    pub fn connect(options: AzureOptions) -> Result<Self> {
        if !valid_container(&options.container) {
            return Err(Error::option(
                "container",
                format!(
                    "{:?}: 3 to 63 of [a-z0-9-], starting and ending with a letter or digit, no \"--\"",
                    options.container
                ),
            ));
        }
        if options.timeout.is_zero() {
            return Err(Error::option("timeout", "must be more than zero"));
        }
        let conn = match env("AZURE_STORAGE_CONNECTION_STRING") {
            Some(s) if options.credentials.is_none() => sharedkey::parse_connection_string(&s)?,
            _ => sharedkey::Connection::default(),
        };
        let emulator = env("AZURE_STORAGE_USE_EMULATOR").is_some_and(|v| v == "true" || v == "1");
        let from_env = || {
            let account = options
                .account
                .clone()
                .or_else(|| env("AZURE_STORAGE_ACCOUNT_NAME"))
                .or_else(|| env("AZURE_STORAGE_ACCOUNT"))?;
            let key = env("AZURE_STORAGE_ACCOUNT_KEY").or_else(|| env("AZURE_STORAGE_KEY"))?;
            Some(AzureCredentials::new(account, key))
        };
        let credentials = options
            .credentials
            .clone()
            .or(conn.credentials)
            .or_else(from_env)
            .or_else(|| emulator.then(|| AzureCredentials::new(DEV_ACCOUNT.0, DEV_ACCOUNT.1)))
            .ok_or_else(|| {
                Error::option(
                    "credentials",
                    "no Azure Storage account key: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY as the az CLI names them), or AZURE_STORAGE_USE_EMULATOR=true",
                )
            })?;
        let endpoint = options
            .endpoint
            .clone()
            .or(conn.endpoint)
            .or_else(|| {
                emulator.then(|| {
                    let base = env("AZURITE_BLOB_STORAGE_URL")
                        .unwrap_or_else(|| "http://127.0.0.1:10000".into());
                    format!("{}/{}", base.trim_end_matches('/'), credentials.account)
                })
            })
            .unwrap_or_else(|| format!("https://{}.blob.core.windows.net", credentials.account));
        let u = url::Url::parse(&endpoint)
            .map_err(|e| Error::option("endpoint", format!("{endpoint:?}: {e}")))?;
        let origin = match (u.scheme(), u.host_str(), u.port()) {
            (s @ ("http" | "https"), Some(h), Some(p)) => format!("{s}://{h}:{p}"),
            (s @ ("http" | "https"), Some(h), None) => format!("{s}://{h}"),
            _ => {
                return Err(Error::option(
                    "endpoint",
                    format!("{endpoint:?}: expected http(s)://HOST[:PORT][/ACCOUNT]"),
                ))
            }
        };
        let container_path = format!(
            "{}/{}",
            u.path().trim_end_matches('/'),
            uri_encode(&options.container, false)
        );
        let describe = format!(
            "az://{}/{}?endpoint={endpoint}",
            options.container,
            options.prefix.trim_start_matches('/')
        );
        let backend = Azure {
            describe,
            credentials,
            origin,
            container_path,
        };
        Ok(AzureStore {
            objects: std::sync::Arc::new(Objects::new(backend, &options.prefix, options.timeout)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_names() {
        assert!(valid_container("locks") && valid_container("my-locks-1"));
        for bad in ["", "ab", "Locks", "a--b", "-ab", "a_b"] {
            assert!(!valid_container(bad), "{bad}");
        }
    }

    #[test]
    fn an_emulator_endpoint_keeps_its_account_path_and_debug_hides_the_key() {
        let mut o = AzureOptions::new("locks");
        o.credentials = Some(AzureCredentials::new(DEV_ACCOUNT.0, DEV_ACCOUNT.1));
        o.endpoint = Some("http://127.0.0.1:9/devstoreaccount1".into());
        o.prefix = "p".into();
        let s = AzureStore::connect(o).unwrap();
        assert_eq!(s.objects.backend.container_path, "/devstoreaccount1/locks");
        assert_eq!(
            s.object_name(&crate::key::Key::new("job").unwrap()),
            "p/job.json"
        );
        assert!(!format!("{s:?}").contains(DEV_ACCOUNT.1));
    }
}
