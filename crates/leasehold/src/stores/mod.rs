//! The stores, and the one registry of the URL schemes that open them.
//!
//! Each store is one module here, behind a Cargo feature of the same name (`memory` and `file` are
//! always built). Every store opens the same way: its options (`RedisOptions`, `S3Options` …) are
//! read from a URL by `XOptions::from_url`, or built in code, and `XStore::connect(options)` makes
//! the store (the file store opens a directory: [`file::FileStore::open`]).
//!
//! A registry lists every URL scheme once, with its store, its feature and its options type:
//! [`crate::open_store`] reads the options from the URL and connects, and the "built without
//! feature X" error ([`Error::FeatureNotEnabled`]), the "unknown scheme" error and the table below
//! all come from it. Adding a store is one module, one line in the registry and one line in the
//! conformance tests.
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
use crate::store::{LockStore, StoreOptions};
use crate::url::{invalid, scheme_of};
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
#[cfg(feature = "object-http")]
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

/// The fuzzer's check of a URL's options ([`StoreOptions::checked`]).
#[cfg(feature = "fuzzing")]
pub(crate) type Checker = fn(&str) -> Result<Vec<std::time::Duration>>;

/// Opens the store of options type `O` from `url`: the one [`Opener`] of every registry line.
fn open_with<O: StoreOptions>(url: &str) -> Opening<'_> {
    Box::pin(async move {
        let store = O::from_url(url)?.connect().await;
        match store {
            Err(e) if O::OPTION_IS_URL_ERROR => Err(crate::url::option_error_in(url, e)),
            r => r,
        }
    })
}

/// Checks the options of type `O` that `url` gives: the one [`Checker`] of every registry line.
#[cfg(feature = "fuzzing")]
fn check_with<O: StoreOptions>(url: &str) -> Result<Vec<std::time::Duration>> {
    O::from_url(url)?.checked()
}

/// Whether a scheme's store is in this build.
#[derive(Clone, Copy)]
enum Availability {
    /// Built: opened by this function (and checked by the fuzzer by the other).
    Built(Opener, #[cfg(feature = "fuzzing")] Checker),
    /// Its Cargo feature is not enabled in this build.
    #[allow(dead_code)] // a build with every feature
    FeatureOff,
}

/// One family of URL schemes that open the same store: a line of the registry.
#[derive(Clone, Copy)]
pub(crate) struct Scheme {
    /// The URL schemes (before `://`), lower case.
    schemes: &'static [&'static str],
    /// The URL forms, for the docs' table.
    #[cfg_attr(not(test), allow(dead_code))] // the docs' table, kept by a test
    forms: &'static str,
    /// The store's module under [`crate::stores`] and what it opens.
    #[cfg_attr(not(test), allow(dead_code))] // the docs' table, kept by a test
    store: (&'static str, &'static str),
    /// The Cargo feature that builds it (`None`: always built).
    feature: Option<&'static str>,
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
    fn is_built(&self) -> bool {
        matches!(self.available, Availability::Built(..))
    }
}

/// A registry line for a store behind a feature: its options type `$opts` is only named when the
/// feature is on.
macro_rules! store {
    ($schemes:expr, $forms:expr, $module:literal, $what:literal, $feature:literal, $opts:ty) => {
        Scheme {
            schemes: &$schemes,
            forms: $forms,
            store: ($module, $what),
            feature: Some($feature),
            available: {
                #[cfg(feature = $feature)]
                const AVAILABLE: Availability = Availability::Built(
                    open_with::<$opts>,
                    #[cfg(feature = "fuzzing")]
                    check_with::<$opts>,
                );
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
    ($schemes:expr, $forms:expr, $module:literal, $what:literal, $opts:ty) => {
        Scheme {
            schemes: &$schemes,
            forms: $forms,
            store: ($module, $what),
            feature: Some($module),
            available: Availability::Built(
                open_with::<$opts>,
                #[cfg(feature = "fuzzing")]
                check_with::<$opts>,
            ),
        }
    };
}

/// Every URL scheme leasehold knows, in the order of the docs' table: the registry.
pub(crate) const SCHEMES: &[Scheme] = &[
    always!(["file"], "`file:///path/to/dir[?mode=0640&fsync=true]`", "file", "", file::FileUrl),
    always!(["memory"], "`memory://`", "memory", "", memory::MemoryUrl),
    always!(
        ["record-memory"],
        "`record-memory://`",
        "memory",
        "the record adapter over memory",
        memory::RecordMemoryUrl
    ),
    store!(
        ["redis", "rediss", "redis+unix"],
        "`redis://[user:pass@]host:port/db[?prefix=…&timeout=…&replicas=N]`, `rediss://…[?ca=…]`, `redis+unix:///path/redis.sock[?db=…&user=…&pass=…]`",
        "redis",
        "",
        "redis",
        redis::RedisOptions
    ),
    store!(
        ["redis+sentinel", "rediss+sentinel"],
        "`redis+sentinel://[user:pass@]s1:26379,s2:26379/MASTER[/db]`, `rediss+sentinel://…`",
        "redis",
        "Sentinel",
        "redis",
        redis::RedisOptions
    ),
    store!(
        ["redis+cluster", "rediss+cluster"],
        "`redis+cluster://[user:pass@]h1:p1,h2:p2,…[?prefix=…]`, `rediss+cluster://…[?ca=…]`",
        "redis",
        "Cluster",
        "redis-cluster",
        redis::RedisOptions
    ),
    store!(
        ["redlock"],
        "`redlock://host1:port1,host2:port2,host3:port3[/db]`",
        "redlock",
        "",
        "redlock",
        redlock::RedlockOptions
    ),
    store!(
        ["k8s", "kubernetes"],
        "`k8s://[namespace][?prefix=…&server=…]`, `kubernetes://…`",
        "kubernetes",
        "Lease objects",
        "kubernetes",
        kubernetes::KubernetesOptions
    ),
    store!(
        ["gs", "gcs"],
        "`gs://bucket/prefix[?endpoint=…&timeout=…]`, `gcs://…`",
        "gcs",
        "Google Cloud Storage objects",
        "gcs",
        gcs::GcsOptions
    ),
    store!(
        ["s3"],
        "`s3://bucket/prefix[?endpoint=…&region=…&profile=…]`",
        "s3",
        "Amazon S3 and S3-compatible servers",
        "s3",
        s3::S3Options
    ),
    store!(
        ["az", "azure"],
        "`az://container/prefix[?account=…&endpoint=…]`, `azure://…`",
        "azure",
        "Azure Blob Storage",
        "azure",
        azure::AzureOptions
    ),
    store!(
        ["postgres", "postgresql"],
        "`postgres://user[:pass]@host:port/db[?schema=…&table=…&timeout=…&sslmode=…]`, `postgresql://…`",
        "postgres",
        "",
        "postgres",
        postgres::PostgresOptions
    ),
    store!(
        ["etcd"],
        "`etcd://[user:pass@]host1:2379,host2:2379[?prefix=…&timeout=…]`",
        "etcd",
        "",
        "etcd",
        etcd::EtcdOptions
    ),
];

/// Where the store names in [`markdown_table`] link to.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
enum Links<'a> {
    /// This module's rustdoc page: the always-built stores (`memory`, `file`) link to their
    /// modules, the others are plain names (their modules may be compiled out).
    Rustdoc,
    /// The book's store pages: `[redis](PREFIXredis.md)`.
    Pages(&'a str),
}

/// The docs' table of [`SCHEMES`] (Markdown): this module's docs, the README and the book's
/// stores page carry it, and a test keeps them equal to it.
#[cfg(test)]
fn markdown_table(links: Links<'_>) -> String {
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

/// The fuzzer's check of a URL's options ([`StoreOptions::checked`]), by the registry: `None` for
/// a URL without a known scheme of this build.
#[cfg(feature = "fuzzing")]
pub(crate) fn check(url: &str) -> Option<Result<Vec<std::time::Duration>>> {
    let scheme = scheme_of(url)?;
    let entry = SCHEMES
        .iter()
        .find(|s| s.schemes.contains(&scheme.as_str()))?;
    match entry.available {
        Availability::Built(_, check) => Some(check(url)),
        Availability::FeatureOff => None,
    }
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
        Availability::Built(open, ..) => open(url).await,
        Availability::FeatureOff => Err(Error::FeatureNotEnabled {
            scheme,
            feature: entry.feature.unwrap_or_default(),
        }),
    }
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

    /// The contributor docs list every store of the registry: ARCHITECTURE.md's module map its
    /// folder or file, CONTRIBUTING.md's conformance suite its scheme.
    #[test]
    fn the_contributor_docs_list_every_store() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let read = |f: &str| std::fs::read_to_string(format!("{root}/{f}")).unwrap_or_default();
        let architecture = read("ARCHITECTURE.md");
        let contributing = read("CONTRIBUTING.md");
        let conformance = contributing
            .split("\n## ")
            .find(|s| s.starts_with("The conformance suite"))
            .unwrap_or_default();
        let mut missing = Vec::new();
        for s in SCHEMES {
            let module = format!("`crates/leasehold/src/stores/{}", s.store.0);
            if !architecture.contains(&module) {
                missing.push(format!("ARCHITECTURE.md's module map: {module}…`"));
            }
            let url = format!("`{}://`", s.schemes[0]);
            if !conformance.contains(&url) {
                missing.push(format!(
                    "CONTRIBUTING.md's \"The conformance suite\": {url}"
                ));
            }
        }
        missing.dedup();
        assert!(
            missing.is_empty(),
            "stores of the registry missing from the contributor docs:\n{}",
            missing.join("\n")
        );
    }

    /// A duration a URL gives is at most 100 years: a longer `?timeout=` made opening a Redis or
    /// etcd store panic (the connection's limit is twice it, which overflowed), a longer
    /// `?max_clock_skew=` wrapped around in milliseconds. Refused before anything connects.
    #[tokio::test]
    async fn durations_past_100_years_are_refused() {
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
