//! A PostgreSQL connection as the queue and the lock store make it: the URL's own parameters
//! (`timeout`, TLS), connecting and listening for notifications, statements prepared once per
//! connection, every call bounded, and the driver's errors as leasehold's (retryable or not).

use crate::error::{Error, Result};
use crate::pg::tls;
use crate::url::Params;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::{Client, GenericClient, Row, Statement};

/// The bound of every call (and of connecting) without `?timeout=`.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The statements prepared on one connection, by their text. A statement of a hot call (claim,
/// heartbeat, start, finish, give back) is parsed and planned by the server once per connection:
/// each of its later runs costs one round trip (bind and execute) where an unprepared one costs
/// two (parse and describe, then bind and execute).
#[derive(Debug, Default)]
pub(crate) struct Prepared(parking_lot::Mutex<std::collections::HashMap<String, Statement>>);

impl Prepared {
    /// `sql` prepared on `c`'s connection (once).
    pub(crate) async fn get(
        &self,
        c: &impl GenericClient,
        sql: &str,
    ) -> std::result::Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.0.lock().get(sql) {
            return Ok(s.clone());
        }
        let s = c.prepare(sql).await?;
        self.0.lock().insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    /// Runs `sql` on `c`, prepared: the number of rows it changed.
    #[cfg_attr(not(feature = "queue-postgres"), allow(dead_code))] // the queue's
    pub(crate) async fn execute(
        &self,
        c: &impl GenericClient,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        c.execute(&self.get(c, sql).await?, params).await
    }

    /// Runs the query `sql` on `c`, prepared: its rows.
    pub(crate) async fn query(
        &self,
        c: &impl GenericClient,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        c.query(&self.get(c, sql).await?, params).await
    }

    /// Runs the query `sql` on `c`, prepared: its one row, if any.
    #[cfg_attr(not(feature = "queue-postgres"), allow(dead_code))] // the queue's
    pub(crate) async fn query_opt(
        &self,
        c: &impl GenericClient,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> std::result::Result<Option<Row>, tokio_postgres::Error> {
        c.query_opt(&self.get(c, sql).await?, params).await
    }
}

/// A connection and the statements prepared on it (dropped with it).
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) prepared: Arc<Prepared>,
}

impl Conn {
    pub(crate) fn new(client: Client) -> Self {
        Conn {
            client,
            prepared: Arc::default(),
        }
    }
}

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// Where and how to connect: a URL's driver settings, bound and TLS, parsed once.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) timeout: Duration,
    pub(crate) tls: tls::Connect,
    /// The URL without credentials, for messages.
    pub(crate) shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The driver's config would show the password.
        f.debug_struct("Target")
            .field("url", &self.shown)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Target {
    /// Parses `url`: `timeout` and the TLS parameters are the connection's, the rest the
    /// driver's.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        Self::from_params(url, Params::of_url(url))
    }

    /// Parses `url` whose parameters `params` are, less those a caller took already.
    pub(crate) fn from_params(url: &str, mut params: Params) -> Result<Self> {
        let shown = params.shown().to_owned();
        let timeout = params
            .take_positive_duration("timeout")?
            .unwrap_or(DEFAULT_TIMEOUT);
        let mut tls = tls::Params::default();
        params.take_raw(|pair| tls.take(pair, &shown))?;
        // The driver refuses what it does not know.
        let base = url.split_once('?').map_or(url, |(b, _)| b);
        let url = match params.rest() {
            Some(rest) => format!("{base}?{rest}"),
            None => base.to_owned(),
        };
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| Error::InvalidUrl {
            url: shown.clone(),
            reason: format!("{e}"),
        })?;
        config.ssl_mode(tls.ssl_mode());
        let tls = tls.connector(&shown)?;
        Ok(Target {
            config,
            timeout,
            tls,
            shown,
        })
    }

    /// A connection listening on `channel` ([`connect_listening`]).
    pub(crate) async fn connect(&self, channel: &str, on: OnNotice) -> Result<Client> {
        connect_listening(
            &self.config,
            &self.shown,
            self.timeout,
            channel,
            on,
            &self.tls,
        )
        .await
    }
}

/// What a listening connection hears: a notification's payload, or its end (`None`).
pub(crate) type OnNotice = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// A connection to the server at `config` that listens on `channel` (none when empty; `on` is
/// called with each notification's payload, and with `None` when the connection ends), made
/// within `timeout`.
pub(crate) async fn connect_listening(
    config: &tokio_postgres::Config,
    shown: &str,
    timeout: Duration,
    channel: &str,
    on: OnNotice,
    tls: &tls::Connect,
) -> Result<Client> {
    let (client, mut connection) = tokio::time::timeout(timeout, config.connect(tls.clone()))
        .await
        .map_err(|_| Error::Unavailable {
            source: None,
            store: shown.to_owned(),
            detail: format!(
                "no connection within {}",
                humantime::format_duration(timeout)
            ),
        })?
        .map_err(|e| connect_error(shown, &e))?;
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => on(Some(n.payload())),
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "PostgreSQL connection ended");
                    break;
                }
                None => break,
            }
        }
        on(None);
    });
    if !channel.is_empty() {
        // The channel is an identifier: quoted, its quotes doubled.
        let listen = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
        bounded(shown, timeout, client.batch_execute(&listen)).await?;
    }
    Ok(client)
}

/// A connection that failed: non-retryable when retrying cannot help (a certificate or a TLS
/// handshake refused, a server without the TLS the URL requires, credentials the server refuses:
/// SQLSTATE class 28), retryable otherwise (a server that cannot be reached or is starting).
fn connect_error(shown: &str, e: &tokio_postgres::Error) -> Error {
    let refused = e.code().is_some_and(|c| c.code().starts_with("28"));
    let mut tls = false;
    // The driver's words, then each cause's it does not repeat (a TLS error's is the reason).
    let mut detail = match e.as_db_error() {
        Some(db) => format!("{e}: {}", db.message()),
        None => e.to_string(),
    };
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let inner = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        tls |= c.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>());
        let words = c.to_string();
        if !detail.contains(&words) {
            detail = format!("{detail}: {words}");
        }
        cause = c.source();
    }
    // The driver says so in words only (its error kinds are private).
    let no_tls = detail.contains("server does not support TLS");
    if refused || tls || no_tls {
        Error::Store {
            source: None,
            store: shown.to_owned(),
            detail,
            retryable: false,
        }
    } else {
        Error::Unavailable {
            source: None,
            store: shown.to_owned(),
            detail,
        }
    }
}

/// `call`, bounded by `timeout`: an error of the server's, or [`Error::no_answer`].
pub(crate) async fn bounded<T>(
    shown: &str,
    timeout: Duration,
    call: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(|e| pg_err(shown, e)),
        Err(_) => Err(Error::no_answer(shown)),
    }
}

pub(crate) fn pg_err(url: &str, e: tokio_postgres::Error) -> Error {
    pg_classify(url, &e).caused_by(e)
}

/// The [`Error`] a driver error means (see [`pg_err`]), without its source.
fn pg_classify(url: &str, e: &tokio_postgres::Error) -> Error {
    let retryable = e.is_closed()
        || e.code().is_some_and(|c| {
            let s = c.code();
            // serialization failure, deadlock, connection exceptions, too many connections
            s == "40001" || s == "40P01" || s.starts_with("08") || s == "53300"
        });
    if e.is_closed() || e.code().is_none() {
        return Error::Unavailable {
            source: None,
            store: url.into(),
            detail: e.to_string(),
        };
    }
    let _ = retryable;
    Error::Store {
        source: None,
        store: url.into(),
        detail: format!("{e}: {}", e.as_db_error().map_or("", |d| d.message())),
        retryable,
    }
}
