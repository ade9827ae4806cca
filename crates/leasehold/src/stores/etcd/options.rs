//! The etcd store's options ([`EtcdOptions`]) and its URL:
//! `etcd://[user:pass@]host1:2379,host2:2379[?prefix=…&timeout=…&tls=true&ca=…&cert=…&key=…]`.

use crate::error::Result;
use crate::url::Params;
use std::path::PathBuf;
use std::time::Duration;

/// The largest request etcd accepts by default (`--max-request-bytes`, 1.5 MiB): a lease record
/// (its key, holder and labels) must fit in one.
pub const MAX_REQUEST_BYTES: usize = 1_572_864;

/// The most bytes of holder id and labels a lease may carry here
/// ([`AcquireRequest::check_size`](crate::AcquireRequest::check_size)): a record holds them and
/// a waiter's id of the same bound within one request.
pub const LABEL_LIMIT: usize = 512 << 10;

/// Options of the etcd store. `Debug` never shows the password.
///
/// ```
/// use leasehold::stores::etcd::EtcdOptions;
/// let mut opts = EtcdOptions::default();
/// opts.user = Some(("locker".into(), "s3cret".into()));
/// assert_eq!(opts.prefix, "leasehold/");
/// assert!(!format!("{opts:?}").contains("s3cret"));
/// let opts = EtcdOptions::from_url("etcd://locker:s3cret@10.0.0.1:2379,10.0.0.2:2379?prefix=jobs/")?;
/// assert_eq!(opts.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// The members' client URLs (`http://host:port`, or `https://…` with TLS).
    pub endpoints: Vec<String>,
    /// The prefix of every key the store writes (default `leasehold/`, `?prefix=`): lease records
    /// live at `<prefix>lock/<key>`, waiter registrations at `<prefix>waiter/<key>`.
    pub prefix: String,
    /// The time limit of each call (default 2 s, `?timeout=`).
    pub timeout: Duration,
    /// A user and password (etcd's auth, `etcd://user:pass@…`).
    pub user: Option<(String, String)>,
    /// Speak TLS to the members (`https://`; `?tls=true`, implied by `ca`, `cert`).
    pub tls: bool,
    /// A PEM file of the CA that signed the members' certificates (`?ca=`); default: the
    /// system's trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM files of a client certificate and its key (`?cert=` and `?key=`, given together), for
    /// members started with `--client-cert-auth`.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "leasehold/".into(),
            timeout: Duration::from_secs(2),
            user: None,
            tls: false,
            ca_file: None,
            client_cert: None,
        }
    }
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("user", &self.user.as_ref().map(|(u, _)| (u, "***")))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .finish()
    }
}

impl EtcdOptions {
    /// Parses `etcd://[user:pass@]host1:2379,host2:2379[?prefix=…&timeout=…&tls=true&ca=…&cert=…&key=…]`.
    ///
    /// ```
    /// use leasehold::stores::etcd::EtcdOptions;
    /// let o = EtcdOptions::from_url("etcd://h1:2379?ca=/etc/etcd/ca.pem&timeout=5s")?;
    /// assert_eq!(o.endpoints, ["https://h1:2379"]); // a CA file means TLS
    /// assert!(EtcdOptions::from_url("etcd://h1:2379?cert=/c.pem").is_err()); // no key
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::InvalidUrl`] naming what is wrong (a member without a port, an unknown parameter,
    /// a bad duration, `cert` without `key`).
    pub fn from_url(url: &str) -> Result<Self> {
        let mut params = Params::of_url(url);
        let rest = url
            .split_once("://")
            .map(|(_, r)| r)
            .ok_or_else(|| params.invalid("expected etcd://host1:2379,host2:2379"))?;
        let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
        let authority = rest.trim_end_matches('/');
        if authority.contains('/') {
            return Err(params.invalid("no path is taken: etcd://host1:2379,host2:2379[?prefix=…]"));
        }
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => {
                let (name, pass) = u.split_once(':').unwrap_or((u, ""));
                let decode = |s: &str| {
                    url::form_urlencoded::parse(format!("x={s}").as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default()
                };
                (Some((decode(name), decode(pass))), h)
            }
            None => (None, authority),
        };
        let mut opts = EtcdOptions {
            user,
            ..EtcdOptions::default()
        };
        let mut hosts_seen = vec![];
        for host in hosts.split(',') {
            match host.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                    hosts_seen.push(host.to_owned())
                }
                _ => {
                    return Err(params.invalid(format!(
                        "bad member {host:?}: expected host:port, e.g. 127.0.0.1:2379"
                    )))
                }
            }
        }
        match params.take_str("prefix") {
            Some(p) if p.is_empty() => return Err(params.invalid("prefix must not be empty")),
            Some(p) => opts.prefix = p,
            None => {}
        }
        if let Some(t) = params.take_positive_duration("timeout")? {
            opts.timeout = t;
        }
        if let Some(tls) = params.take_bool("tls")? {
            opts.tls = tls;
        }
        opts.ca_file = params.take_path("ca");
        let (cert, key) = (params.take_path("cert"), params.take_path("key"));
        opts.client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(params.invalid("cert and key are given together")),
        };
        params.finish()?;
        opts.tls |= opts.ca_file.is_some() || opts.client_cert.is_some();
        let scheme = if opts.tls { "https" } else { "http" };
        opts.endpoints = hosts_seen
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect();
        Ok(opts)
    }
}

impl crate::store::StoreOptions for EtcdOptions {
    fn from_url(url: &str) -> Result<Self> {
        EtcdOptions::from_url(url)
    }

    async fn connect(self) -> Result<std::sync::Arc<dyn crate::store::LockStore>> {
        Ok(std::sync::Arc::new(super::EtcdStore::connect(self).await?))
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        assert!(!self.prefix.is_empty(), "an empty prefix");
        Ok(vec![self.timeout])
    }
}

/// How the store names itself in messages: `etcd://` and its members, no credentials.
pub(crate) fn describe(opts: &EtcdOptions) -> String {
    let hosts: Vec<&str> = opts
        .endpoints
        .iter()
        .map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h))
        .collect();
    let user = opts
        .user
        .as_ref()
        .map(|(u, _)| format!("{u}:***@"))
        .unwrap_or_default();
    let tls = if opts.tls { " (TLS)" } else { "" };
    format!("etcd://{user}{}{tls}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<EtcdOptions> {
        EtcdOptions::from_url(url)
    }

    fn err(url: &str) -> String {
        parse(url).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn urls_are_read() {
        let o = parse("etcd://a:1,b:2,c:3?prefix=app/&timeout=500ms").expect("parses");
        assert_eq!(o.endpoints, ["http://a:1", "http://b:2", "http://c:3"]);
        assert_eq!(
            (o.prefix.as_str(), o.timeout),
            ("app/", Duration::from_millis(500))
        );
        let o = parse("etcd://u:p%40ss@h:2379?ca=/ca.pem").expect("parses");
        assert_eq!(o.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(o.endpoints, ["https://h:2379"]);
        assert_eq!(describe(&o), "etcd://u:***@h:2379 (TLS)");
    }

    #[test]
    fn bad_urls_say_why() {
        assert!(err("etcd://a").contains("expected host:port"));
        assert!(err("etcd://a:1?nope=1").contains("unknown parameter"));
        assert!(err("etcd://a:1?timeout=x").contains("expected a duration"));
        assert!(err("etcd://a:1?cert=/c").contains("together"));
        assert!(err("etcd://a:1/x").contains("no path"));
        assert!(!err("etcd://u:hunter2@a?x").contains("hunter2"));
    }
}
