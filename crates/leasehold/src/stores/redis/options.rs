//! The Redis store's options ([`RedisOptions`]) and what its URLs say besides a server's
//! address: the query parameters ([`RedisOptions::from_url`], [`RedisOptions::read`]), the
//! checks made before anything connects ([`checked`]), and the server lists of
//! `redis+sentinel://`, `redis+cluster://` and `redlock://` ([`host_list`]).

use crate::error::{Error, Result};
use crate::url::Params;
use std::time::Duration;

/// Options of the Redis store: where the server is ([`RedisOptions::url`]) and how to use it.
/// `Debug` never shows the password.
///
/// ```
/// use leasehold::stores::redis::RedisOptions;
/// use std::time::Duration;
/// let o = RedisOptions::from_url("redis://u:s3cret@10.0.0.1:6379/0?prefix=agent:lock:&timeout=1s")?;
/// assert_eq!(o.url, "redis://u:s3cret@10.0.0.1:6379/0");
/// assert_eq!((o.prefix.as_str(), o.timeout), ("agent:lock:", Duration::from_secs(1)));
/// assert!(!format!("{o:?}").contains("s3cret"));
/// // The same in code:
/// let mut o = RedisOptions::new("redis://u:s3cret@10.0.0.1:6379/0");
/// o.prefix = "agent:lock:".into();
/// o.timeout = Duration::from_secs(1);
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// The server: `redis://[user:pass@]host:port/db`, `rediss://…` (TLS),
    /// `redis+unix:///path/redis.sock[?db=…&user=…&pass=…]`, or the servers of a Sentinel
    /// (`redis+sentinel://[user:pass@]s1:26379,s2:26379/MASTER[/db][?sentinel_user=…&sentinel_pass=…]`,
    /// `rediss+sentinel://…`) or of a Cluster (`redis+cluster://[user:pass@]h1:p1,h2:p2,…`,
    /// `rediss+cluster://…`). Default `redis://127.0.0.1:6379/0`.
    pub url: String,
    /// Record key prefix (default `leasehold:lock:`).
    pub prefix: String,
    /// Fence counter prefix (default derived from `prefix`, see the module docs).
    pub fence_prefix: Option<String>,
    /// Per-command response timeout (default 2 s); a server that stops answering makes calls fail
    /// after this, so a holder's `lost()` fires before its TTL runs out.
    pub timeout: Duration,
    /// For `rediss://`: a PEM file of the CA that signed the server's certificate (`?ca=`);
    /// default: the system's trust store.
    pub ca_file: Option<std::path::PathBuf>,
    /// For `rediss://` to a server that asks clients for a certificate (`tls-auth-clients yes`,
    /// Redis's default with TLS): PEM files of the client's certificate and key (`?cert=` and
    /// `?key=`, given together).
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Replicas that must have each grant and renewal before the store answers it
    /// (`?replicas=N`; default 0, none): each acquire and renewal script call is followed, on
    /// the same connection and in the same round trip, by Redis's `WAIT N timeout`. When fewer
    /// replicas acknowledge in time, a grant is released and the acquisition fails with a
    /// retryable [`Error::Store`]; a renewal fails the same way, so a holder whose renewals stay
    /// unacknowledged sees `lost()` once its lease could have expired. This narrows what a
    /// failover can lose (a promoted replica that lacks the last grant lets in a second holder)
    /// without closing it: `WAIT` is not a consensus (see the book's Redis page,
    /// `docs/src/stores/redis.md#replication`). One server, plain or behind Sentinel, and a
    /// cluster (each primary's replicas); refused on Redlock. An ACL user needs `+wait`: without
    /// it, acquisitions fail with a non-retryable `NOPERM` error (and their grants are released).
    /// Grants and renewals then go on a connection of their own (a second one per server), since
    /// `WAIT` holds its connection until answered: releases, inspections and listings are never
    /// held up behind it.
    pub replicas: u32,
    /// How long a grant or renewal waits for the replicas' acknowledgements
    /// (`?replicas_timeout=`; default half of `timeout`, and always less than it).
    pub replicas_timeout: Option<Duration>,
}

/// The replicas a replicated write waits for ([`RedisOptions::replicas`]): Redis's `WAIT`
/// arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub(super) replicas: u32,
    pub(super) timeout_ms: u64,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &crate::url::redact(&self.url))
            .field("prefix", &self.prefix)
            .field("fence_prefix", &self.fence_prefix)
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("replicas", &self.replicas)
            .field("replicas_timeout", &self.replicas_timeout)
            .finish()
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            url: "redis://127.0.0.1:6379/0".into(),
            prefix: "leasehold:lock:".into(),
            fence_prefix: None,
            timeout: Duration::from_secs(2),
            ca_file: None,
            client_cert: None,
            replicas: 0,
            replicas_timeout: None,
        }
    }
}

impl RedisOptions {
    /// Options for the server at `url` (see [`RedisOptions::url`]), every other one at its
    /// default.
    ///
    /// ```
    /// let o = leasehold::stores::redis::RedisOptions::new("rediss://cache.internal:6380/2");
    /// assert_eq!(o.prefix, "leasehold:lock:");
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            ..RedisOptions::default()
        }
    }

    /// The options a `redis://`, `rediss://`, `redis+unix://`, `redis+sentinel://` or
    /// `redis+cluster://` URL gives: its parameters `prefix`, `fence_prefix`, `timeout`,
    /// `replicas`, `replicas_timeout` and the TLS files (`ca`, `cert`, `key`) are taken out of
    /// it, and the rest is [`RedisOptions::url`] (a Unix socket's `db`, `user` and `pass`, and
    /// the sentinels' `sentinel_user` and `sentinel_pass`, stay in it).
    ///
    /// ```
    /// use leasehold::stores::redis::RedisOptions;
    /// let o = RedisOptions::from_url("redis+unix:///run/redis.sock?db=2&prefix=app:lock:")?;
    /// assert_eq!((o.url.as_str(), o.prefix.as_str()), ("redis+unix:///run/redis.sock?db=2", "app:lock:"));
    /// let o = RedisOptions::from_url("redis+sentinel://s1:26379,s2:26379/mymaster?replicas=1")?;
    /// assert_eq!((o.url.as_str(), o.replicas), ("redis+sentinel://s1:26379,s2:26379/mymaster", 1));
    /// assert!(RedisOptions::from_url("redis://h:6379/0?prefx=a:").is_err());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL that does not parse, a bad value or an unknown
    /// parameter. The servers named are checked when connecting.
    pub fn from_url(url: &str) -> Result<Self> {
        let scheme = crate::url::scheme_of(url).unwrap_or_default();
        // A Unix socket URL has no host for credentials or path for the database: the redis
        // crate reads them from these parameters, which stay in the URL it gets.
        let (theirs, note): (&[&'static str], &str) = match scheme.as_str() {
            "redis+unix" => (&["db", "user", "pass"], "; db, user, pass"),
            "redis+sentinel" | "rediss+sentinel" => (
                &["sentinel_user", "sentinel_pass"],
                "; sentinel_user, sentinel_pass",
            ),
            "redis+cluster" | "rediss+cluster" => (&[], ""),
            _ => {
                // One server: a URL the `url` crate (and the redis crate) reads.
                crate::url::parse(url)?;
                (&[], "; db, user, pass for redis+unix")
            }
        };
        let mut params = Params::of_url(url);
        let mut opts = RedisOptions::default();
        opts.read(&mut params)?;
        let kept = params.keep(theirs);
        params.finish_noting(note)?;
        let base = url.split_once('?').map_or(url, |(b, _)| b);
        opts.url = match kept {
            Some(q) => format!("{base}?{q}"),
            None => base.to_owned(),
        };
        Ok(opts)
    }

    /// Reads `prefix`, `fence_prefix`, `timeout`, `replicas`, `replicas_timeout` and the TLS
    /// files (`ca`, `cert`, `key`) from URL parameters (a Redlock URL's too).
    pub(crate) fn read(&mut self, params: &mut Params) -> Result<()> {
        if let Some(prefix) = params.take_str("prefix") {
            self.prefix = prefix;
        }
        if let Some(prefix) = params.take_str("fence_prefix") {
            self.fence_prefix = Some(prefix);
        }
        if let Some(timeout) = params.take_duration("timeout")? {
            self.timeout = timeout;
        }
        if let Some(n) = params.take_u64("replicas", "replicas")? {
            self.replicas = u32::try_from(n).map_err(|_| {
                params.invalid(format!("replicas {n}: expected a whole number of replicas"))
            })?;
        }
        if let Some(t) = params.take_duration("replicas_timeout")? {
            self.replicas_timeout = Some(t);
        }
        if let Some(ca) = params.take_path("ca") {
            self.ca_file = Some(ca);
        }
        self.client_cert = match (params.take_path("cert"), params.take_path("key")) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => self.client_cert.take(),
            _ => {
                return Err(params
                    .invalid("?cert= (the client's certificate) and ?key= (its key) go together"))
            }
        };
        Ok(())
    }

    /// What a replicated write waits for (`None` when [`RedisOptions::replicas`] is 0), or an
    /// [`Error::InvalidUrl`] for `described` when the wait is 0 (`WAIT` would block for ever) or
    /// not shorter than `timeout` (the call would run out of time first), or is given without
    /// replicas.
    pub(crate) fn wait(&self, described: &str) -> Result<Option<Wait>> {
        let bad = |reason: String| Error::InvalidUrl {
            url: described.to_owned(),
            reason,
        };
        if self.replicas == 0 {
            return match self.replicas_timeout {
                Some(_) => Err(bad(
                    "replicas_timeout is how long to wait for replicas: give replicas=N too".into(),
                )),
                None => Ok(None),
            };
        }
        let timeout = self.replicas_timeout.unwrap_or(self.timeout / 2);
        let ms = timeout.as_millis();
        if ms == 0 || timeout >= self.timeout {
            return Err(bad(format!(
                "replicas_timeout {timeout:?} must be at least 1ms and less than the timeout ({:?})",
                self.timeout
            )));
        }
        Ok(Some(Wait {
            replicas: self.replicas,
            timeout_ms: ms as u64,
        }))
    }

    /// An [`Error::InvalidOption`] when replicas are asked for on Redlock, which does not wait
    /// for them.
    #[cfg(feature = "redlock")]
    pub(crate) fn no_replicas(&self) -> Result<()> {
        if self.replicas == 0 && self.replicas_timeout.is_none() {
            return Ok(());
        }
        Err(Error::option(
            "replicas",
            "replicas and replicas_timeout are not for Redlock, whose nodes are independent primaries (a majority of them is its safeguard)",
        ))
    }

    /// Whether the options name TLS files (`?ca=`, `?cert=`, `?key=`), which only a TLS URL
    /// takes.
    pub(crate) fn names_tls_files(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some()
    }

    /// The TLS material the options name, read from its files: the CA and the client's
    /// certificate and key; `None` when none is named (the system trust store, no client
    /// certificate).
    pub(crate) fn tls_certificates(&self) -> Result<Option<::redis::TlsCertificates>> {
        let read = |what: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| Error::io(what, path.display(), e))
        };
        let root_cert = match &self.ca_file {
            Some(ca) => Some(read("read CA file", ca)?),
            None => None,
        };
        let client_tls = match &self.client_cert {
            Some((cert, key)) => Some(::redis::ClientTlsConfig {
                client_cert: read("read client certificate", cert)?,
                client_key: read("read client key", key)?,
            }),
            None => None,
        };
        Ok(
            (root_cert.is_some() || client_tls.is_some()).then_some(::redis::TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }

    pub(crate) fn fence_prefix(&self) -> String {
        match &self.fence_prefix {
            Some(p) => p.clone(),
            None => match self.prefix.strip_suffix("lock:") {
                Some(base) => format!("{base}fence:"),
                None => "leasehold:fence:".into(),
            },
        }
    }
}

/// What a store takes from its options once they are checked ([`checked`]).
pub(crate) struct Checked {
    /// The fence counters' prefix.
    pub(crate) fence_prefix: String,
    /// What grants and renewals wait for ([`RedisOptions::wait`]).
    pub(crate) wait: Option<Wait>,
}

/// `opts` checked before anything connects: the fence prefix against the record prefix
/// ([`checked_fence_prefix`]), and the replicas to wait for ([`RedisOptions::wait`]) for
/// `described`.
pub(crate) fn checked(opts: &RedisOptions, described: &str) -> Result<Checked> {
    let fence_prefix = checked_fence_prefix(opts)?;
    let wait = opts.wait(described)?;
    Ok(Checked { fence_prefix, wait })
}

/// The fence prefix of `opts`, checked against its record prefix: both non-empty, neither a
/// prefix of the other (so no record key can be a counter key).
fn checked_fence_prefix(opts: &RedisOptions) -> Result<String> {
    let fence_prefix = opts.fence_prefix();
    if opts.prefix.is_empty()
        || opts.prefix.starts_with(&fence_prefix)
        || fence_prefix.starts_with(&opts.prefix)
    {
        return Err(Error::option(
            "prefix",
            format!("record prefix {:?} and fence prefix {fence_prefix:?} must be non-empty and neither may start with the other", opts.prefix),
        ));
    }
    Ok(fence_prefix)
}

/// A URL naming several servers, as `redlock://` and `redis+sentinel://` do:
/// `SCHEME://[user:pass@]host1:port1,host2:port2,…[/PATH][?QUERY]`.
pub(crate) struct HostList<'a> {
    /// `user:pass@` as written, or empty.
    pub(crate) userinfo: String,
    /// Each `host:port`, checked to have both.
    pub(crate) hosts: Vec<&'a str>,
    /// What follows the first `/` after the hosts (may be empty).
    pub(crate) path: &'a str,
    /// What follows `?` (may be empty).
    pub(crate) query: &'a str,
}

/// Splits a [`HostList`] URL of `scheme`; `described` (the URL without its password) names it
/// in errors.
pub(crate) fn host_list<'a>(url: &'a str, scheme: &str, described: &str) -> Result<HostList<'a>> {
    let bad = |reason: String| Error::InvalidUrl {
        url: described.to_owned(),
        reason,
    };
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .ok_or_else(|| bad(format!("expected {scheme}://host1:port1,host2:port2,…")))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    for host in &hosts {
        match host.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {}
            _ => return Err(bad(format!("bad server {host:?}: expected host:port"))),
        }
    }
    Ok(HostList {
        userinfo,
        hosts,
        path,
        query,
    })
}

impl crate::store::StoreOptions for RedisOptions {
    fn from_url(url: &str) -> Result<Self> {
        RedisOptions::from_url(url)
    }

    async fn connect(self) -> Result<std::sync::Arc<dyn crate::store::LockStore>> {
        Ok(std::sync::Arc::new(super::RedisStore::connect(self).await?))
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        super::RedisStore::check_options(self)?;
        let fence = self.fence_prefix();
        assert!(
            !self.prefix.is_empty()
                && !self.prefix.starts_with(&fence)
                && !fence.starts_with(&self.prefix),
            "prefixes {:?} / {fence:?}",
            self.prefix
        );
        Ok([Some(self.timeout), self.replicas_timeout]
            .into_iter()
            .flatten()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options and the redis crate's URL of `url`, or the error's text.
    fn split(url: &str) -> std::result::Result<(String, RedisOptions), String> {
        RedisOptions::from_url(url)
            .map(|opts| (opts.url.clone(), opts))
            .map_err(|e| e.to_string())
    }

    fn opts(url: &str) -> RedisOptions {
        split(url).map(|(_, o)| o).expect("good options")
    }

    fn refusal(url: &str) -> String {
        split(url).map(|(_, o)| o).expect_err("refused")
    }

    #[test]
    fn defaults() {
        let o = opts("redis://h:6379/0");
        assert_eq!(o.prefix, "leasehold:lock:");
        assert_eq!(o.fence_prefix, None);
        assert_eq!(o.timeout, Duration::from_secs(2));
        assert_eq!((o.replicas, o.replicas_timeout), (0, None));
        assert!(!o.names_tls_files());
        let checked = checked(&o, "redis://h:6379/0").expect("checked");
        assert_eq!(checked.fence_prefix, "leasehold:fence:");
        assert!(checked.wait.is_none());
    }

    #[test]
    fn query_parameters_set_options() {
        let o = opts(
            "redis://h:1/0?prefix=agent:lock:&timeout=250ms&replicas=2&replicas_timeout=100ms",
        );
        assert_eq!(o.prefix, "agent:lock:");
        assert_eq!(o.timeout, Duration::from_millis(250));
        assert_eq!(o.replicas, 2);
        assert_eq!(o.replicas_timeout, Some(Duration::from_millis(100)));
        let wait = o
            .wait("redis://h:1/0")
            .expect("a good wait")
            .expect("replicas");
        assert_eq!((wait.replicas, wait.timeout_ms), (2, 100));
        // The fence counters follow the record prefix.
        assert_eq!(
            checked_fence_prefix(&o).as_deref().ok(),
            Some("agent:fence:")
        );
        let o = opts("redis://h:1/0?prefix=jobs:&fence_prefix=jobs-fence:");
        assert_eq!(
            checked_fence_prefix(&o).as_deref().ok(),
            Some("jobs-fence:")
        );
        let o = opts("redis://h:1/0?prefix=jobs:");
        assert_eq!(
            checked_fence_prefix(&o).as_deref().ok(),
            Some("leasehold:fence:")
        );
    }

    #[test]
    fn bad_values_and_unknown_parameters_are_refused() {
        for (url, says) in [
            ("redis://h:1/0?timeout=soon", "timeout \"soon\""),
            (
                "redis://h:1/0?replicas=two",
                "expected a whole number of replicas",
            ),
            (
                "redis://h:1/0?replicas=-1",
                "expected a whole number of replicas",
            ),
            (
                "redis://h:1/0?replicas=1&replicas_timeout=x",
                "replicas_timeout \"x\"",
            ),
            (
                "redis://h:1/0?prefx=a:",
                "unknown parameter \"prefx\" (known: prefix",
            ),
            // `db`, `user` and `pass` are parameters of Unix socket URLs only.
            ("redis://h:1/0?db=2", "unknown parameter \"db\""),
            (
                "rediss://h:1/0?cert=c.pem",
                "?cert= (the client's certificate) and ?key= (its key) go together",
            ),
            ("rediss://h:1/0?key=k.pem", "go together"),
        ] {
            let text = refusal(url);
            assert!(text.starts_with("invalid store URL"), "{url}: {text}");
            assert!(text.contains(says), "{url}: {text}");
        }
    }

    #[test]
    fn replica_waits_are_checked() {
        let wait = |url: &str| opts(url).wait(url).map_err(|e| e.to_string());
        // Half of the timeout by default.
        let w = wait("redis://h:1/0?replicas=1&timeout=1s")
            .expect("good")
            .expect("some");
        assert_eq!((w.replicas, w.timeout_ms), (1, 500));
        for (url, says) in [
            ("redis://h:1/0?replicas_timeout=1s", "give replicas=N too"),
            (
                "redis://h:1/0?replicas=1&replicas_timeout=2s",
                "less than the timeout",
            ),
            (
                "redis://h:1/0?replicas=1&replicas_timeout=3s",
                "less than the timeout",
            ),
            (
                "redis://h:1/0?replicas=1&replicas_timeout=0ms",
                "at least 1ms",
            ),
            ("redis://h:1/0?replicas=1&timeout=1ms", "at least 1ms"),
        ] {
            let text = wait(url).expect_err(url);
            assert!(text.contains(says), "{url}: {text}");
        }
    }

    #[cfg(feature = "redlock")]
    #[test]
    fn redlock_takes_no_replicas() {
        assert!(opts("redis://h:1/0").no_replicas().is_ok());
        for url in [
            "redis://h:1/0?replicas=1",
            "redis://h:1/0?replicas_timeout=1s",
        ] {
            let e = opts(url).no_replicas().expect_err(url);
            assert!(
                matches!(
                    e,
                    Error::InvalidOption {
                        name: "replicas",
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }

    #[test]
    fn colliding_prefixes_are_refused() {
        for (prefix, fence) in [
            ("", None),
            ("a:", Some("a:fence:")),
            ("a:fence:", Some("a:")),
            ("same:", Some("same:")),
        ] {
            let o = RedisOptions {
                prefix: prefix.into(),
                fence_prefix: fence.map(Into::into),
                ..RedisOptions::default()
            };
            let e = checked(&o, "redis://h:1/0").err();
            assert!(
                matches!(e, Some(Error::InvalidOption { name: "prefix", .. })),
                "{prefix:?} {fence:?}: {e:?}"
            );
        }
    }

    #[test]
    fn tls_files_are_read_from_the_query() {
        let o = opts("rediss://h:1/0?ca=/etc/ca.pem&cert=/etc/c.pem&key=/etc/k.pem");
        assert_eq!(
            o.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let (cert, key) = o.client_cert.clone().expect("a client certificate");
        assert_eq!(
            (cert.to_str(), key.to_str()),
            (Some("/etc/c.pem"), Some("/etc/k.pem"))
        );
        assert!(o.names_tls_files());
        // A file that cannot be read fails with its path.
        let missing = opts("rediss://h:1/0?ca=/nonexistent/leasehold-ca.pem");
        let e = missing.tls_certificates().err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("read CA file /nonexistent/leasehold-ca.pem")),
            "{e:?}"
        );
        // None named: the system's trust store.
        assert!(matches!(
            opts("rediss://h:1/0").tls_certificates(),
            Ok(None)
        ));
    }

    #[test]
    fn a_unix_socket_keeps_db_user_and_pass_for_the_redis_crate() {
        let (clean, o) =
            split("redis+unix:///run/redis.sock?db=2&prefix=p:lock:&user=u&pass=secret&timeout=1s")
                .expect("good");
        assert_eq!(
            clean,
            "redis+unix:///run/redis.sock?db=2&user=u&pass=secret"
        );
        assert_eq!(o.prefix, "p:lock:");
        assert_eq!(o.timeout, Duration::from_secs(1));
        // Elsewhere the query is ours alone.
        let (clean, _) = split("redis://u:secret@h:1/3?prefix=p:lock:").expect("good");
        assert_eq!(clean, "redis://u:secret@h:1/3");
    }

    #[test]
    fn secrets_stay_out_of_errors() {
        for url in [
            "redis://u:hunter2@h:1/0?bogus=1",
            "redis+unix:///run/r.sock?pass=hunter2&bogus=1",
            "redis://u:hunter2@h:1/0?timeout=soon",
        ] {
            let text = refusal(url);
            assert!(!text.contains("hunter2"), "{text}");
            assert!(text.contains("***"), "{text}");
        }
        let e = host_list(
            "redis+sentinel://u:hunter2@s1",
            "redis+sentinel",
            "redis+sentinel://u:***@s1",
        )
        .err()
        .map(|e| e.to_string());
        assert!(e.is_some_and(|e| !e.contains("hunter2")));
    }

    #[test]
    fn host_lists() {
        let url = "redlock://u:p@h1:1,h2:2,[::1]:3/0?prefix=a:&timeout=1s";
        let list = host_list(url, "redlock", "redlock://u:***@…").expect("good");
        assert_eq!(list.userinfo, "u:p@");
        assert_eq!(list.hosts, ["h1:1", "h2:2", "[::1]:3"]);
        assert_eq!((list.path, list.query), ("0", "prefix=a:&timeout=1s"));
        let bare = host_list("redlock://h1:1", "redlock", "redlock://h1:1").expect("good");
        assert_eq!(
            (bare.userinfo.as_str(), bare.path, bare.query),
            ("", "", "")
        );
        for (url, says) in [
            (
                "redis://h1:1",
                "expected redlock://host1:port1,host2:port2,…",
            ),
            ("redlock://h1", "bad server \"h1\": expected host:port"),
            ("redlock://h1:1,:2", "bad server \":2\""),
            ("redlock://h1:1,h2:port", "bad server \"h2:port\""),
            ("redlock://h1:1,h2:70000", "bad server \"h2:70000\""),
            ("redlock://", "bad server \"\""),
        ] {
            let text = host_list(url, "redlock", url).err().map(|e| e.to_string());
            assert!(
                text.as_deref().is_some_and(|t| t.contains(says)),
                "{url}: {text:?}"
            );
        }
    }
}
