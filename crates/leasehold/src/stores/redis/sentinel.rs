//! Redis Sentinel (`redis+sentinel://…`, `rediss+sentinel://…`): what its URL names
//! ([`parse`]), the sentinels that name a master group's primary ([`Sentinels::primary`]), and
//! the followers of their `+switch-master` announcements ([`Sentinels::follow`]). The link
//! (`link.rs`) asks them where to connect; they know nothing of the link or the store.

use super::conn::{bounded, open_client};
use super::options::{host_list, RedisOptions};
use crate::error::{Error, Result};
use crate::url::Params;
use futures_util::StreamExt;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What a `redis+sentinel://` (or `rediss+sentinel://`) URL names.
pub(super) struct SentinelUrl {
    /// The scheme of sentinels and data servers alike: `rediss` (TLS for all) or `redis`.
    scheme: &'static str,
    /// Each sentinel's URL, with the sentinels' credentials (`?sentinel_user=`, `?sentinel_pass=`).
    sentinels: Vec<String>,
    /// The master group's name.
    master: String,
    /// The data servers' `user:pass@` as written, or empty.
    userinfo: String,
    /// The data servers' database, as written (may be empty).
    db: String,
    /// The store's options, from the other query parameters.
    pub(super) opts: RedisOptions,
}

/// Reads the URL of `opts` (`redis+sentinel://[user:pass@]host1:port1,host2:port2,…/MASTER[/DB]`,
/// or `rediss+sentinel://…`: TLS to sentinels and data servers alike). The user and password
/// are the data servers'; `?sentinel_pass=…[&sentinel_user=…]` are the sentinels' (none by
/// default), the URL's only parameters (the store's are the options'). `described` (the URL
/// without its secrets) names it in errors.
pub(super) fn parse(opts: RedisOptions, described: &str) -> Result<SentinelUrl> {
    let bad = |reason: &str| Error::InvalidUrl {
        url: described.to_owned(),
        reason: reason.into(),
    };
    let url = opts.url.as_str();
    // The sentinels' and data servers' scheme: TLS for all, or for none.
    let (scheme, sentinel) = if url.starts_with("rediss+sentinel://") {
        ("rediss+sentinel", "rediss")
    } else {
        ("redis+sentinel", "redis")
    };
    let list = host_list(url, scheme, described)?;
    let (master, db) = match list.path.split_once('/') {
        Some((m, d)) => (m, d),
        None => (list.path, ""),
    };
    if master.is_empty() {
        return Err(bad("expected the master group's name after the sentinels, as in redis+sentinel://h1:26379,h2:26379/mymaster/0"));
    }
    let mut params = Params::of_query(url, list.query);
    let (user, pass) = (
        params.take_str("sentinel_user"),
        params.take_str("sentinel_pass"),
    );
    params.finish_noting("; the store's own go to RedisOptions::from_url")?;
    let mut sentinels = vec![];
    for host in &list.hosts {
        let mut u =
            url::Url::parse(&format!("{sentinel}://{host}")).map_err(|e| bad(&e.to_string()))?;
        if let Some(pass) = &pass {
            // Setting credentials fails only for URLs without a host, which these have.
            let _ = u.set_username(user.as_deref().unwrap_or(""));
            let _ = u.set_password(Some(pass));
        }
        sentinels.push(u.to_string());
    }
    Ok(SentinelUrl {
        scheme: sentinel,
        sentinels,
        master: master.to_owned(),
        userinfo: list.userinfo,
        db: db.to_owned(),
        opts,
    })
}

/// Makes a client for the data server at (`ip`, `port`), with the store's credentials, database
/// and TLS settings.
type NodeClient = Arc<dyn Fn(&str, u16) -> Result<::redis::Client> + Send + Sync>;

/// The sentinels of a `redis+sentinel://` (or `rediss+sentinel://`) store.
pub(crate) struct Sentinels {
    /// A client for each sentinel (over TLS for `rediss+sentinel://`).
    sentinels: Vec<::redis::Client>,
    master: String,
    node: NodeClient,
    /// The tasks following the sentinels' `+switch-master` announcements, one per sentinel.
    followers: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Sentinels {
    /// The sentinels `url` names, with a client for each (made with the URL's options, as the
    /// data servers' clients will be: `described` names the store in errors). A data server's
    /// credentials or database that cannot work are refused now, not at the first lookup.
    pub(super) fn open(url: &SentinelUrl, described: &str) -> Result<Self> {
        let SentinelUrl {
            scheme,
            sentinels,
            master,
            userinfo,
            db,
            opts,
        } = url;
        let sentinels = sentinels
            .iter()
            .map(|url| open_client(url, opts, described))
            .collect::<Result<Vec<_>>>()?;
        // A data server's client from its address, with our database and credentials (decoded as
        // the redis crate decodes any URL) and the sentinels' TLS settings.
        let (scheme, userinfo, db) = (*scheme, userinfo.clone(), db.clone());
        let node_opts = opts.clone();
        let node_described = described.to_owned();
        let node: NodeClient = Arc::new(move |ip: &str, port: u16| {
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_owned()
            };
            let url = format!("{scheme}://{userinfo}{host}:{port}/{db}");
            open_client(&url, &node_opts, &node_described)
        });
        // Bad credentials or database: refused now, not at the first lookup.
        node("127.0.0.1", 1)?;
        Ok(Sentinels {
            sentinels,
            master: master.clone(),
            node,
            followers: Mutex::new(vec![]),
        })
    }

    /// Follows every sentinel's `+switch-master` announcements ([`follow_switches`]) until the
    /// sentinels are dropped: `switch` moves `link` (while anything holds it) to the primary a
    /// sentinel announced; `described` names the store in the log.
    pub(super) fn follow<L: Send + Sync + 'static>(
        &self,
        link: Weak<L>,
        described: &str,
        timeout: Duration,
        switch: fn(&L, ::redis::Client),
    ) {
        for sentinel in &self.sentinels {
            let task = tokio::spawn(follow_switches(
                link.clone(),
                sentinel.clone(),
                self.master.clone(),
                self.node.clone(),
                (described.to_owned(), timeout),
                switch,
            ));
            self.followers.lock().push(task.abort_handle());
        }
    }

    /// A client for the primary the sentinels name, checked (`ROLE`) to be one: all sentinels are
    /// asked at once and the first good answer is taken; each answer takes at most `timeout`.
    /// When none is good, the error is retryable if any sentinel's was (one that knows no such
    /// master does not make the others' outage final).
    pub(super) async fn primary(
        &self,
        described: &str,
        timeout: Duration,
    ) -> Result<::redis::Client> {
        let mut asks: futures_util::stream::FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|s| self.ask(s, described, timeout))
            .collect();
        let mut failure: Option<Error> = None;
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(client) => return Ok(client),
                Err(e) => {
                    if failure.as_ref().is_none_or(|f| !f.is_retryable()) {
                        failure = Some(e);
                    }
                }
            }
        }
        Err(failure.unwrap_or_else(|| Error::Unavailable {
            source: None,
            store: described.to_owned(),
            detail: "no sentinels".into(),
        }))
    }

    /// The primary `sentinel` names for the master group, checked to be one.
    async fn ask(
        &self,
        sentinel: &::redis::Client,
        described: &str,
        timeout: Duration,
    ) -> Result<::redis::Client> {
        let named: Option<(String, u16)> =
            bounded(described, timeout, "no answer from a sentinel", async {
                let mut conn = sentinel.get_multiplexed_async_connection().await?;
                ::redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let Some((ip, port)) = named else {
            return Err(Error::Store {
                source: None,
                store: described.to_owned(),
                detail: format!("the sentinels monitor no master named {:?}", self.master),
                retryable: false,
            });
        };
        let client = (self.node)(&ip, port)?;
        let role: Vec<::redis::Value> = bounded(
            described,
            timeout,
            "no answer from the primary the sentinels name",
            async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                ::redis::cmd("ROLE").query_async(&mut conn).await
            },
        )
        .await?;
        let first = role
            .first()
            .and_then(|v| ::redis::from_redis_value_ref::<String>(v).ok());
        if first.as_deref() != Some("master") {
            return Err(Error::Unavailable {
                source: None,
                store: described.to_owned(),
                detail: format!("{ip}:{port}, which the sentinels name, is not a primary (yet)"),
            });
        }
        Ok(client)
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for task in self.followers.lock().drain(..) {
            task.abort();
        }
    }
}

/// Follows one sentinel's `+switch-master` announcements (`<master> <old ip> <old port> <new ip>
/// <new port>`) for the link's master group, subscribing again whenever the subscription ends, and
/// moves the link to the announced primary at once. Every sentinel has a follower of its own, so a
/// sentinel that is down, or silent behind a partition, does not hide a failover the others
/// announce (the first announcement moves the link; the others find it there). Without them the
/// store would move only when the old primary, demoted, answers `READONLY` — which Sentinel does
/// at its next look at that server, up to ~10 s after the failover, while it still takes writes.
/// `node` makes a data server's client; `switch` moves the link; `described` names the store in
/// the log.
async fn follow_switches<L: Send + Sync + 'static>(
    link: Weak<L>,
    client: ::redis::Client,
    master: String,
    node: NodeClient,
    (described, timeout): (String, Duration),
    switch: fn(&L, ::redis::Client),
) {
    loop {
        let subscribed = async {
            let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
                .await
                .ok()?
                .ok()?;
            tokio::time::timeout(timeout, pubsub.subscribe("+switch-master"))
                .await
                .ok()?
                .ok()?;
            Some(pubsub)
        };
        if let Some(pubsub) = subscribed.await {
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let text: String = msg.get_payload().unwrap_or_default();
                let words: Vec<&str> = text.split(' ').collect();
                let [name, _, _, ip, port] = words[..] else {
                    continue;
                };
                let Ok(port) = port.parse::<u16>() else {
                    continue;
                };
                if name != master {
                    continue;
                }
                let Some(link) = link.upgrade() else { return };
                match node(ip, port) {
                    Ok(client) => switch(&link, client),
                    Err(e) => {
                        tracing::warn!(store = %described, error = %e, "cannot use the announced primary")
                    }
                }
            }
        }
        if link.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> Result<SentinelUrl> {
        parse(RedisOptions::from_url(url)?, &crate::url::redact(url))
    }

    #[test]
    fn a_sentinel_url_names_sentinels_master_and_data_servers() {
        let url = "redis+sentinel://u:p@s1:26379,s2:26380/mymaster/3?prefix=a:lock:&sentinel_user=su&sentinel_pass=sp";
        let named = parsed(url).expect("good");
        assert_eq!(named.scheme, "redis");
        assert_eq!(
            named.sentinels,
            ["redis://su:sp@s1:26379", "redis://su:sp@s2:26380"]
        );
        assert_eq!(named.master, "mymaster");
        assert_eq!((named.userinfo.as_str(), named.db.as_str()), ("u:p@", "3"));
        assert_eq!(named.opts.prefix, "a:lock:");
        // No sentinel credentials by default (a password alone: no user), no database.
        let named =
            parsed("rediss+sentinel://s1:26379/m?sentinel_pass=sp&ca=/ca.pem").expect("good");
        assert_eq!(named.scheme, "rediss");
        assert_eq!(named.sentinels, ["rediss://:sp@s1:26379"]);
        assert_eq!((named.userinfo.as_str(), named.db.as_str()), ("", ""));
        assert!(named.opts.ca_file.is_some());
        let named = parsed("redis+sentinel://s1:26379/m").expect("good");
        assert_eq!(named.sentinels, ["redis://s1:26379"]);
    }

    #[test]
    fn bad_sentinel_urls_are_refused_without_their_secrets() {
        for (url, says) in [
            (
                "redis+sentinel://s1:26379",
                "expected the master group's name",
            ),
            (
                "redis+sentinel://u:hunter2@s1:26379/",
                "expected the master group's name",
            ),
            ("redis+sentinel://s1/m", "bad server \"s1\""),
            (
                "redis+sentinel://u:hunter2@s1:26379/m?bogus=1",
                "unknown parameter \"bogus\"",
            ),
            (
                "redis+sentinel://s1:26379/m?sentinel_pass=hunter2&timeout=x",
                "timeout \"x\"",
            ),
        ] {
            let text = parsed(url).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn sentinels_open_without_connecting() {
        let named = parsed("redis+sentinel://u:p@127.0.0.1:1,127.0.0.1:2/m/0").expect("good");
        let sentinels = Sentinels::open(&named, "redis+sentinel://u:***@…").expect("opened");
        assert_eq!(sentinels.sentinels.len(), 2);
        let node = (sentinels.node)("::1", 6379).expect("a data server's client");
        let info = node.get_connection_info();
        assert_eq!(info.redis_settings().username(), Some("u"));
        assert_eq!(info.redis_settings().password(), Some("p"));
        assert_eq!(info.addr().to_string(), "::1:6379");
        // A database the data servers cannot have is refused at once.
        let named = parsed("redis+sentinel://127.0.0.1:1/m/notadb").expect("good");
        assert!(Sentinels::open(&named, "redis+sentinel://…").is_err());
    }
}
