//! The PostgreSQL queue's connection: the URL's own parameters (`timeout`, TLS), connecting and
//! listening for notifications, statements prepared once per connection, every call bounded, and
//! the driver's errors as leasehold's (retryable or not).

use crate::error::{Error, Result};
use crate::postgres::tls;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_postgres::{Client, GenericClient, Row, Statement};

/// The bound of every call (and of connecting) without `?timeout=`.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The statements prepared on one connection, by their text. A statement of a hot call (claim,
/// heartbeat, start, finish, give back) is parsed and planned by the server once per connection:
/// each of its later runs costs one round trip (bind and execute) where an unprepared one costs
/// two (parse and describe, then bind and execute).
#[derive(Debug, Default)]
pub(super) struct Prepared(parking_lot::Mutex<std::collections::HashMap<String, Statement>>);

impl Prepared {
    /// `sql` prepared on `c`'s connection (once).
    pub(super) async fn get(
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
    pub(super) async fn execute(
        &self,
        c: &impl GenericClient,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        c.execute(&self.get(c, sql).await?, params).await
    }

    /// Runs the query `sql` on `c`, prepared: its rows.
    pub(super) async fn query(
        &self,
        c: &impl GenericClient,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        c.query(&self.get(c, sql).await?, params).await
    }

    /// Runs the query `sql` on `c`, prepared: its one row, if any.
    pub(super) async fn query_opt(
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
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) prepared: Arc<Prepared>,
}

impl Conn {
    pub(super) fn new(client: Client) -> Self {
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

/// `url` without the parameters the driver does not know (`timeout`, and the TLS parameters,
/// some of whose values it refuses), that timeout and those TLS parameters.
pub(super) fn split_params(url: &str, shown: &str) -> Result<(String, Duration, tls::Params)> {
    let mut tls = tls::Params::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), DEFAULT_TIMEOUT, tls));
    };
    let mut timeout = DEFAULT_TIMEOUT;
    let mut kept = vec![];
    for pair in query.split('&') {
        if tls.take(pair, shown)? {
            continue;
        }
        match pair.strip_prefix("timeout=") {
            Some(v) => {
                timeout = humantime::parse_duration(v)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| Error::InvalidUrl {
                        url: shown.to_owned(),
                        reason: format!("timeout {v:?}: expected a duration such as 5s or 500ms"),
                    })?;
            }
            None => kept.push(pair),
        }
    }
    if kept.is_empty() {
        return Ok((base.to_owned(), timeout, tls));
    }
    Ok((format!("{base}?{}", kept.join("&")), timeout, tls))
}

/// A connection to the server at `config` that listens for the queue's notifications (woken on
/// `notify`, which is also woken when the connection ends), made within `timeout`.
pub(super) async fn connect_listening(
    config: &tokio_postgres::Config,
    shown: &str,
    timeout: Duration,
    notify: &Arc<Notify>,
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
    let n = notify.clone();
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => n.notify_waiters(),
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "queue connection ended");
                    break;
                }
                None => break,
            }
        }
        n.notify_waiters();
    });
    bounded(
        shown,
        timeout,
        client.batch_execute("LISTEN leasehold_queue"),
    )
    .await?;
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
pub(super) async fn bounded<T>(
    shown: &str,
    timeout: Duration,
    call: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(|e| pg_err(shown, e)),
        Err(_) => Err(Error::no_answer(shown)),
    }
}

pub(super) fn pg_err(url: &str, e: tokio_postgres::Error) -> Error {
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
