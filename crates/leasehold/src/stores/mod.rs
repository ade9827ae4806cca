//! The stores, and the one registry of the URL schemes that open them.
//!
//! Each store is one module here, behind a Cargo feature of the same name (`memory` and `file` are
//! always built). [`SCHEMES`] lists every scheme once, with its store, its feature and how it is
//! opened: [`crate::open_store`], the "built without feature X" error
//! ([`Error::FeatureNotEnabled`]), the "unknown scheme" error and the table below all come from it.
//! Adding a store is one module, one line in [`SCHEMES`] and one line in the conformance tests.
//!
//! <!-- schemes:start -->
//! | URL | store | Cargo feature |
//! |---|---|---|
//! | `file:///path/to/dir[?mode=0640&fsync=true]` | [file](mod@file) | `file` (default) |
//! | `memory://` | [memory](mod@memory) | `memory` (default) |
//! | `record-memory://` | [memory](mod@memory) (the record adapter over memory) | `memory` (default) |
//! | `redis://[user:pass@]host:port/db[?prefix=…&timeout=…&replicas=N]`, `rediss://…[?ca=…]`, `redis+unix:///path/redis.sock[?db=…&user=…&pass=…]` | redis | `redis` |
//! | `redis+sentinel://[user:pass@]s1:26379,s2:26379/MASTER[/db]`, `rediss+sentinel://…` | redis (Sentinel) | `redis` |
//! | `redis+cluster://[user:pass@]h1:p1,h2:p2,…[?prefix=…]`, `rediss+cluster://…[?ca=…]` | redis (Cluster) | `redis-cluster` |
//! | `redlock://host1:port1,host2:port2,host3:port3[/db]` | redlock | `redlock` |
//! | `k8s://[namespace][?prefix=…&server=…]`, `kubernetes://…` | kubernetes (Lease objects) | `kubernetes` |
//! | `gs://bucket/prefix[?endpoint=…&timeout=…]`, `gcs://…` | gcs (Google Cloud Storage objects) | `gcs` |
//! | `s3://bucket/prefix[?endpoint=…&region=…&profile=…]` | s3 (Amazon S3 and S3-compatible servers) | `s3` |
//! | `az://container/prefix[?account=…&endpoint=…]`, `azure://…` | azure (Azure Blob Storage) | `azure` |
//! | `postgres://user[:pass]@host:port/db[?schema=…&table=…&timeout=…&sslmode=…]`, `postgresql://…` | postgres | `postgres` |
//! | `etcd://[user:pass@]host1:2379,host2:2379[?prefix=…&timeout=…]` | etcd | `etcd` |
//! <!-- schemes:end -->

use crate::error::{Error, Result};
use crate::store::LockStore;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

#[cfg(feature = "azure")]
pub mod azure;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod file;
#[cfg(feature = "gcs")]
pub mod gcs;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod memory;
#[cfg(any(feature = "s3", feature = "azure"))]
pub mod object;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "s3")]
pub mod s3;

/// An opening store, as an [`Opener`] returns it.
pub(crate) type Opening<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn LockStore>>> + Send + 'a>>;

/// Opens a store from its whole URL (credentials included).
pub(crate) type Opener = for<'a> fn(&'a str) -> Opening<'a>;

/// Whether a scheme's store is in this build.
#[derive(Clone, Copy)]
enum Availability {
    /// Built: opened by this function.
    Built(Opener),
    /// Its Cargo feature is not enabled in this build.
    #[allow(dead_code)] // a build with every feature
    FeatureOff,
}

/// One family of URL schemes that open the same store.
#[derive(Clone, Copy)]
pub struct Scheme {
    /// The URL schemes (before `://`), lower case.
    pub schemes: &'static [&'static str],
    /// The URL forms, for the docs' table.
    pub forms: &'static str,
    /// The store's module under [`crate::stores`] and what it opens.
    pub store: (&'static str, &'static str),
    /// The Cargo feature that builds it (`None`: always built).
    pub feature: Option<&'static str>,
    available: Availability,
}

impl std::fmt::Debug for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheme")
            .field("schemes", &self.schemes)
            .field("feature", &self.feature)
            .field("built", &self.is_built())
            .finish()
    }
}

impl Scheme {
    /// Whether this build can open it.
    pub fn is_built(&self) -> bool {
        matches!(self.available, Availability::Built(_))
    }
}

/// A registry line for a store behind a feature: `$open` is only named when the feature is on.
macro_rules! store {
    ($schemes:expr, $forms:expr, $module:literal, $what:literal, $feature:literal, $open:path) => {
        Scheme {
            schemes: &$schemes,
            forms: $forms,
            store: ($module, $what),
            feature: Some($feature),
            available: {
                #[cfg(feature = $feature)]
                const AVAILABLE: Availability = Availability::Built($open);
                #[cfg(not(feature = $feature))]
                const AVAILABLE: Availability = Availability::FeatureOff;
                AVAILABLE
            },
        }
    };
}

/// A registry line for a store built in every build (`memory`, `file`: their features exist for
/// symmetry).
macro_rules! always {
    ($schemes:expr, $forms:expr, $module:literal, $what:literal, $open:path) => {
        Scheme {
            schemes: &$schemes,
            forms: $forms,
            store: ($module, $what),
            feature: Some($module),
            available: Availability::Built($open),
        }
    };
}

/// Every URL scheme leasehold knows, in the order of the docs' table.
pub const SCHEMES: &[Scheme] = &[
    always!(["file"], "`file:///path/to/dir[?mode=0640&fsync=true]`", "file", "", open_file),
    always!(["memory"], "`memory://`", "memory", "", open_memory),
    always!(
        ["record-memory"],
        "`record-memory://`",
        "memory",
        "the record adapter over memory",
        open_record_memory
    ),
    store!(
        ["redis", "rediss", "redis+unix"],
        "`redis://[user:pass@]host:port/db[?prefix=…&timeout=…&replicas=N]`, `rediss://…[?ca=…]`, `redis+unix:///path/redis.sock[?db=…&user=…&pass=…]`",
        "redis",
        "",
        "redis",
        open_redis
    ),
    store!(
        ["redis+sentinel", "rediss+sentinel"],
        "`redis+sentinel://[user:pass@]s1:26379,s2:26379/MASTER[/db]`, `rediss+sentinel://…`",
        "redis",
        "Sentinel",
        "redis",
        open_redis_sentinel
    ),
    store!(
        ["redis+cluster", "rediss+cluster"],
        "`redis+cluster://[user:pass@]h1:p1,h2:p2,…[?prefix=…]`, `rediss+cluster://…[?ca=…]`",
        "redis",
        "Cluster",
        "redis-cluster",
        open_redis_cluster
    ),
    store!(
        ["redlock"],
        "`redlock://host1:port1,host2:port2,host3:port3[/db]`",
        "redlock",
        "",
        "redlock",
        open_redlock
    ),
    store!(
        ["k8s", "kubernetes"],
        "`k8s://[namespace][?prefix=…&server=…]`, `kubernetes://…`",
        "kubernetes",
        "Lease objects",
        "kubernetes",
        open_kubernetes
    ),
    store!(
        ["gs", "gcs"],
        "`gs://bucket/prefix[?endpoint=…&timeout=…]`, `gcs://…`",
        "gcs",
        "Google Cloud Storage objects",
        "gcs",
        open_gcs
    ),
    store!(
        ["s3"],
        "`s3://bucket/prefix[?endpoint=…&region=…&profile=…]`",
        "s3",
        "Amazon S3 and S3-compatible servers",
        "s3",
        open_s3
    ),
    store!(
        ["az", "azure"],
        "`az://container/prefix[?account=…&endpoint=…]`, `azure://…`",
        "azure",
        "Azure Blob Storage",
        "azure",
        open_azure
    ),
    store!(
        ["postgres", "postgresql"],
        "`postgres://user[:pass]@host:port/db[?schema=…&table=…&timeout=…&sslmode=…]`, `postgresql://…`",
        "postgres",
        "",
        "postgres",
        open_postgres
    ),
    store!(
        ["etcd"],
        "`etcd://[user:pass@]host1:2379,host2:2379[?prefix=…&timeout=…]`",
        "etcd",
        "",
        "etcd",
        open_etcd
    ),
];

/// Where the store names in [`markdown_table`] link to.
#[derive(Debug, Clone, Copy)]
pub enum Links<'a> {
    /// This module's rustdoc page: the always-built stores (`memory`, `file`) link to their
    /// modules, the others are plain names (their modules may be compiled out).
    Rustdoc,
    /// The book's store pages: `[redis](PREFIXredis.md)`.
    Pages(&'a str),
}

/// The docs' table of [`SCHEMES`] (Markdown): this module's docs, the README and the book's
/// stores page carry it, and a test keeps them equal to it.
pub fn markdown_table(links: Links<'_>) -> String {
    let mut out = String::from("| URL | store | Cargo feature |\n|---|---|---|\n");
    for s in SCHEMES {
        let (module, what) = s.store;
        let name = match (module, links) {
            ("", _) => what.to_owned(),
            ("memory" | "file", Links::Rustdoc) => format!("[{module}](mod@{module})"),
            (m, Links::Rustdoc) => m.to_owned(),
            (m, Links::Pages(prefix)) => format!("[{m}]({prefix}{m}.md)"),
        };
        let store = match (module, what) {
            ("", _) | (_, "") => name,
            (_, w) => format!("{name} ({w})"),
        };
        let feature = match s.feature {
            None => String::new(),
            Some(f @ ("memory" | "file")) => format!("`{f}` (default)"),
            Some(f) => format!("`{f}`"),
        };
        out.push_str(&format!("| {} | {store} | {feature} |\n", s.forms));
    }
    out
}

/// The longest duration a URL parameter may give (`?timeout=`, `?max_clock_skew=` …): 100 years.
/// Deadlines are the monotonic clock plus a multiple of a duration, and times in milliseconds
/// fit a `u64`: a longer duration would overflow them.
pub(crate) const LONGEST_URL_DURATION: std::time::Duration =
    std::time::Duration::from_secs(100 * 31_557_600); // `100y`: humantime's years are 365.25 days

/// How long, at least, an object had gone unwritten when the server answered, by the server's
/// clock: its `Date` header less its `Last-Modified` one, less one second for each header's
/// resolution (both are whole seconds: the answer came at or after `Date`, the write before
/// `Last-Modified` + 1 s). `None` when either is missing or unreadable.
///
/// Both times are the server's (the same service, in practice the same fleet of clocks); no
/// client's clock enters.
#[cfg(any(feature = "object-http", feature = "gcs"))]
pub(crate) fn server_age(
    date: Option<&str>,
    modified: Option<&str>,
) -> Option<std::time::Duration> {
    let date = httpdate::parse_http_date(date?.trim()).ok()?;
    let modified = httpdate::parse_http_date(modified?.trim()).ok()?;
    let age = date.duration_since(modified).ok()?;
    Some(age.saturating_sub(std::time::Duration::from_secs(1)))
}

#[cfg(all(test, any(feature = "object-http", feature = "gcs")))]
mod server_age_tests {
    use super::server_age;
    use std::time::Duration;

    #[test]
    fn the_age_is_a_lower_bound_in_whole_seconds() {
        let at = |t: &str| format!("Thu, 26 Nov 2026 17:{t} GMT");
        assert_eq!(
            server_age(Some(&at("10:49")), Some(&at("10:47"))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            server_age(Some(&at("10:47")), Some(&at("10:47"))),
            Some(Duration::ZERO)
        );
        // A Last-Modified after the Date (another front end's clock): no age to trust.
        assert_eq!(server_age(Some(&at("10:47")), Some(&at("10:49"))), None);
        assert_eq!(server_age(None, Some(&at("10:47"))), None);
        assert_eq!(server_age(Some("yesterday"), Some(&at("10:47"))), None);
    }
}

/// A duration as a URL parameter gives it (`500ms`, `2s`, `1h 30m`), at most
/// [`LONGEST_URL_DURATION`]; the error says why not.
pub(crate) fn url_duration(v: &str) -> std::result::Result<std::time::Duration, String> {
    let d = humantime::parse_duration(v).map_err(|e| e.to_string())?;
    if d > LONGEST_URL_DURATION {
        return Err("longer than 100 years".into());
    }
    Ok(d)
}

/// The scheme of a URL, lower case, if it has the `SCHEME://` shape.
pub(crate) fn scheme_of(url: &str) -> Option<String> {
    let (s, _) = url.split_once("://")?;
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    ok.then(|| s.to_ascii_lowercase())
}

fn invalid(url: &str, reason: impl Into<String>) -> Error {
    Error::InvalidUrl {
        url: crate::redact_url(url),
        reason: reason.into(),
    }
}

/// Parses a URL the `url` crate understands (one host), as the stores that take one need.
pub(crate) fn parse(url: &str) -> Result<url::Url> {
    url::Url::parse(url).map_err(|e| invalid(url, e.to_string()))
}

/// Opens the store a URL names ([`crate::open_store`]).
pub(crate) async fn open(url: &str) -> Result<Arc<dyn LockStore>> {
    let Some(scheme) = scheme_of(url) else {
        return Err(invalid(
            url,
            "expected SCHEME://…, e.g. file:///var/lib/locks or redis://127.0.0.1:6379/0",
        ));
    };
    let Some(entry) = SCHEMES
        .iter()
        .find(|s| s.schemes.contains(&scheme.as_str()))
    else {
        let known: Vec<&str> = SCHEMES
            .iter()
            .flat_map(|s| s.schemes.iter().copied())
            .collect();
        return Err(invalid(
            url,
            format!("unknown scheme (known: {})", known.join(", ")),
        ));
    };
    match entry.available {
        Availability::Built(open) => open(url).await,
        Availability::FeatureOff => Err(Error::FeatureNotEnabled {
            scheme,
            feature: entry.feature.unwrap_or_default(),
        }),
    }
}

fn open_memory(_url: &str) -> Opening<'_> {
    Box::pin(async { Ok(Arc::new(memory::MemoryStore::new()) as Arc<dyn LockStore>) })
}

fn open_record_memory(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let (_, skew) = take_max_clock_skew(url)?;
        let store = crate::adapter::RecordLockStore::new(memory::RecordMemoryStore::new())
            .with_max_clock_skew(skew);
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

/// Takes the generic adapter's `max_clock_skew` parameter out of a compare-and-set store's URL:
/// the URL without it, and its value (default [`crate::adapter::DEFAULT_MAX_CLOCK_SKEW`]).
pub(crate) fn take_max_clock_skew(url: &str) -> Result<(String, std::time::Duration)> {
    const NAME: &str = "max_clock_skew";
    let mut skew = crate::adapter::DEFAULT_MAX_CLOCK_SKEW;
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), skew));
    };
    let mut kept = vec![];
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((NAME, v)) => {
                skew = url_duration(v).map_err(|e| invalid(url, format!("{NAME}={v}: {e}")))?;
            }
            _ if pair == NAME => {
                return Err(invalid(
                    url,
                    format!("{NAME} needs a duration, e.g. {NAME}=5m"),
                ))
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, skew))
}

fn open_file(url: &str) -> Opening<'_> {
    Box::pin(
        async move { Ok(Arc::new(file::FileStore::from_url(&parse(url)?)?) as Arc<dyn LockStore>) },
    )
}

#[cfg(feature = "redis")]
fn open_redis(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = redis::RedisStore::from_url(&parse(url)?).await?;
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "redis")]
fn open_redis_sentinel(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = redis::RedisStore::from_sentinel_url(url).await?;
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "redis-cluster")]
fn open_redis_cluster(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = redis::RedisStore::from_cluster_url(url).await?;
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "redlock")]
fn open_redlock(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = redlock::RedlockStore::from_url(url).await?;
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = postgres::PostgresStore::connect(url).await?;
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "kubernetes")]
fn open_kubernetes(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let (rest, skew) = take_max_clock_skew(url)?;
        let store = kubernetes::KubernetesStore::from_url(&parse(&rest)?).await?;
        let store = crate::adapter::RecordLockStore::new(store).with_max_clock_skew(skew);
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "gcs")]
fn open_gcs(url: &str) -> Opening<'_> {
    Box::pin(async move {
        // The store reads `max_clock_skew` too: it is the margin of the `expiresAt` it writes.
        let (_, skew) = take_max_clock_skew(url)?;
        let store = gcs::GcsStore::from_url(&parse(url)?).await?;
        let store = crate::adapter::RecordLockStore::new(store).with_max_clock_skew(skew);
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "s3")]
fn open_s3(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let (rest, skew) = take_max_clock_skew(url)?;
        let store = s3::S3Store::from_url(&parse(&rest)?)?;
        let store = crate::adapter::RecordLockStore::new(store).with_max_clock_skew(skew);
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "azure")]
fn open_azure(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let (rest, skew) = take_max_clock_skew(url)?;
        let store = azure::AzureStore::from_url(&parse(&rest)?)?;
        let store = crate::adapter::RecordLockStore::new(store).with_max_clock_skew(skew);
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(feature = "etcd")]
fn open_etcd(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = etcd::EtcdStore::from_url(url).await?;
        Ok(Arc::new(store) as Arc<dyn LockStore>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_is_listed_once() {
        let mut all: Vec<&str> = SCHEMES
            .iter()
            .flat_map(|s| s.schemes.iter().copied())
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a scheme is listed twice");
    }

    /// The table in this module's docs, the README and the book is the one [`markdown_table`]
    /// makes. `LEASEHOLD_BLESS=1` writes it into the README and the book.
    #[test]
    fn the_docs_tables_are_current() {
        let source = include_str!("mod.rs");
        let docs: String = source
            .lines()
            .filter_map(|l| l.strip_prefix("//! ").or(l.strip_prefix("//!")))
            .collect::<Vec<_>>()
            .join("\n");
        let table = between_markers(&docs).unwrap_or_default();
        assert_eq!(
            table.trim_end(),
            markdown_table(Links::Rustdoc).trim_end(),
            "regenerate the table in stores/mod.rs"
        );
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        for (file, links) in [
            ("README.md", Links::Pages("docs/src/stores/")),
            ("docs/src/stores.md", Links::Pages("stores/")),
        ] {
            let path = format!("{root}/{file}");
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let want = markdown_table(links);
            if std::env::var_os("LEASEHOLD_BLESS").is_some() {
                if let (Some(a), Some(b)) = (text.find(START), text.find(END)) {
                    let new = format!("{}{START}\n{want}{}", &text[..a], &text[b..]);
                    std::fs::write(&path, new).unwrap_or_default();
                    continue;
                }
            }
            assert_eq!(
                between_markers(&text).as_deref(),
                Some(want.as_str()),
                "{file}: the stores table differs from stores::SCHEMES (LEASEHOLD_BLESS=1 cargo test -p leasehold --lib stores rewrites it)"
            );
        }
    }

    /// A duration a URL gives is at most 100 years: a longer `?timeout=` made opening a Redis or
    /// etcd store panic (the connection's limit is twice it, which overflowed), a longer
    /// `?max_clock_skew=` wrapped around in milliseconds. Refused before anything connects.
    #[tokio::test]
    async fn durations_past_100_years_are_refused() {
        assert_eq!(
            url_duration("100y"),
            Ok(humantime::parse_duration("100y").unwrap())
        );
        assert!(url_duration("101y").unwrap_err().contains("100 years"));
        let long = "500000000000y";
        #[allow(unused_mut)] // one URL per store in this build
        let mut urls = vec![format!("record-memory://?max_clock_skew={long}")];
        #[cfg(feature = "redis")]
        urls.extend([
            format!("redis://127.0.0.1:1/0?timeout={long}"),
            format!("redis://127.0.0.1:1/0?replicas=1&replicas_timeout={long}"),
            format!("redis+sentinel://127.0.0.1:1/m?timeout={long}"),
        ]);
        #[cfg(feature = "redis-cluster")]
        urls.push(format!("redis+cluster://127.0.0.1:1?timeout={long}"));
        #[cfg(feature = "redlock")]
        urls.push(format!(
            "redlock://127.0.0.1:1,127.0.0.1:2/0?timeout={long}"
        ));
        #[cfg(feature = "etcd")]
        urls.push(format!("etcd://127.0.0.1:1?timeout={long}"));
        #[cfg(feature = "postgres")]
        urls.push(format!("postgres://u@127.0.0.1:1/db?timeout={long}"));
        #[cfg(feature = "kubernetes")]
        urls.push(format!("k8s://default?timeout={long}"));
        #[cfg(feature = "gcs")]
        urls.push(format!(
            "gs://bucket/p?endpoint=http://127.0.0.1:1&timeout={long}"
        ));
        #[cfg(feature = "s3")]
        urls.push(format!(
            "s3://bucket/p?endpoint=http://127.0.0.1:1&timeout={long}"
        ));
        #[cfg(feature = "azure")]
        urls.push(format!(
            "az://container/p?account=a&endpoint=http://127.0.0.1:1&timeout={long}"
        ));
        for url in urls {
            match open(&url).await {
                Err(Error::InvalidUrl { reason, .. }) => {
                    assert!(reason.contains(long), "{url}: {reason}")
                }
                other => panic!("{url}: {:?}", other.err()),
            }
        }
    }

    const START: &str = "<!-- schemes:start -->";
    const END: &str = "<!-- schemes:end -->";

    fn between_markers(text: &str) -> Option<String> {
        let start = text.find(START)? + START.len();
        let end = text.find(END)?;
        Some(text.get(start..end)?.trim_start_matches('\n').to_owned())
    }

    #[tokio::test]
    async fn errors_come_from_the_registry() {
        let err =
            |r: Result<Arc<dyn LockStore>>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(open("nope://x").await).contains("unknown scheme (known: file, memory"));
        assert!(err(open("x").await).contains("expected SCHEME://"));
        #[cfg(not(feature = "kubernetes"))]
        assert!(matches!(
            open("k8s://default").await,
            Err(Error::FeatureNotEnabled {
                feature: "kubernetes",
                ..
            })
        ));
        assert!(open("MEMORY://").await.is_ok());
    }
}
