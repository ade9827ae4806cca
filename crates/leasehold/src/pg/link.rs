//! One shared connection, made again when it ends: calls from many tasks are pipelined on it
//! (the driver sends each as soon as it is made and matches the answers in order), and the
//! connection listens on one channel for notifications.

use super::conn::{bounded, Conn, OnNotice, Target};
use crate::error::{Error, Result};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A connection of a [`Link`] and whether it still lives.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) conn: Conn,
    alive: Arc<AtomicBool>,
}

impl Live {
    /// Whether the connection is still up (not ended, and no call ran out of time on it).
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self.conn.is_closed()
    }

    /// The flag [`Live::alive`] reads, for a subscription made on this connection.
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        self.alive.clone()
    }
}

/// A connection shared by every call of a store, listening on `channel`; made again by the first
/// call after it ended or after a call ran out of time on it (the server then rolls back what
/// that call had not committed).
pub(crate) struct Link {
    target: Target,
    channel: String,
    on: OnNotice,
    /// Run on each new connection before its first call (session settings).
    setup: &'static str,
    current: parking_lot::Mutex<Option<Arc<Live>>>,
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("target", &self.target)
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link to `target` listening on `channel`, telling `on` what it hears (and `None` each
    /// time a connection ends), running `setup` on each new connection. Connects at the first
    /// call.
    pub(crate) fn new(target: Target, channel: String, on: OnNotice, setup: &'static str) -> Self {
        Link {
            target,
            channel,
            on,
            setup,
            current: parking_lot::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// The URL without credentials.
    pub(crate) fn shown(&self) -> &str {
        &self.target.shown
    }

    /// The bound of every call.
    pub(crate) fn timeout(&self) -> std::time::Duration {
        self.target.timeout
    }

    /// The live connection, made first if there is none.
    pub(crate) async fn get(&self) -> Result<Arc<Live>> {
        if let Some(l) = self.current.lock().as_ref().filter(|l| l.alive()) {
            return Ok(l.clone());
        }
        let _one = self.connecting.lock().await;
        if let Some(l) = self.current.lock().as_ref().filter(|l| l.alive()) {
            return Ok(l.clone());
        }
        let alive = Arc::new(AtomicBool::new(true));
        let (flag, on) = (alive.clone(), self.on.clone());
        let heard: OnNotice = Arc::new(move |payload| {
            if payload.is_none() {
                flag.store(false, Ordering::SeqCst);
            }
            on(payload)
        });
        let client = self.target.connect(&self.channel, heard).await?;
        if !self.setup.is_empty() {
            bounded(
                &self.target.shown,
                self.target.timeout,
                client.batch_execute(self.setup),
            )
            .await?;
        }
        let live = Arc::new(Live {
            conn: Conn::new(client),
            alive,
        });
        *self.current.lock() = Some(live.clone());
        Ok(live)
    }

    /// `call` on the live connection, bounded by the URL's timeout. A call that runs out of time
    /// or finds the connection ended gives the connection up (its listeners are told), so the
    /// next call makes a new one.
    pub(crate) async fn call<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnOnce(Arc<Live>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    {
        let live = self.get().await?;
        let out = bounded(&self.target.shown, self.target.timeout, call(live.clone())).await;
        if out.as_ref().is_err_and(Error::is_no_answer) || live.conn.is_closed() {
            self.give_up(&live);
        }
        out
    }

    /// Gives `live` up: the next call connects again.
    fn give_up(&self, live: &Arc<Live>) {
        if live.alive.swap(false, Ordering::SeqCst) {
            (self.on)(None);
        }
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, live)) {
            *current = None;
        }
    }
}
