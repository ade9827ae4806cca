//! Taking and holding a lease for `run`, `elect` and `hold`: the acquisition the flags ask for,
//! a wait that a termination signal ends, a lease held until a stop, and the events told.

use crate::cli::LeaseArgs;
use crate::exit::{self, Failure, LOST, OK};
use crate::metrics::{self, Endpoint};
use crate::output::{clean, print};
use crate::process::child::signal_status;
use crate::process::signals::{self, Forwarded};
use crate::valid::Held;
use leasehold::{Error, Key, LeaseGuard, LockBuilder, Locks, PermitRequest, StopReason, Wait};
use serde_json::json;

/// How `run` and `hold` start: from here on SIGTERM, SIGINT and SIGHUP are ours to handle (while
/// waiting they end the wait), the metrics endpoint is served, and the lease `held` is obtained.
pub(crate) async fn take(
    store_url: Option<&str>,
    lease: &LeaseArgs,
    held: &Held,
) -> Result<(Forwarded, Locks, LeaseGuard), Failure> {
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let endpoint = Endpoint::given(lease.metrics);
    let locks = metrics::locks(store_url, endpoint.as_ref()).await?;
    Endpoint::serve_given(endpoint).await?;
    let builder = lease_builder(&locks, &held.key, lease)?.loss_grace(held.lease_loss_grace);
    let guard = obtain(builder, &held.key, lease.no_wait, &mut signals).await?;
    Ok((signals, locks, guard))
}

/// The acquisition `lease` asks for: the key's lock or one of its permits (`--permits`,
/// `--read`, `--write`), its TTL, wait and labels.
pub(crate) fn lease_builder(
    locks: &Locks,
    key: &Key,
    lease: &LeaseArgs,
) -> Result<LockBuilder, Failure> {
    let builder = match lease.permit() {
        None => locks.lock_key(key.clone()),
        Some(PermitRequest::Semaphore { permits }) => locks.semaphore(key.as_str(), permits)?,
        Some(PermitRequest::Read) => locks.read_write(key.as_str())?.read(),
        Some(PermitRequest::Write) => locks.read_write(key.as_str())?.write(),
    };
    let mut builder = builder.ttl(lease.ttl);
    builder = match (lease.no_wait, lease.wait) {
        // One attempt; held elsewhere is `Error::Timeout` naming the holder, and a store error
        // stays a store error (exit 1), not "not obtained".
        (true, _) => builder.wait_policy(Wait::No),
        (false, Some(limit)) => builder.wait(limit),
        (false, None) => builder.wait_policy(Wait::Forever),
    };
    for (name, value) in &lease.labels {
        builder = builder.label(name, value);
    }
    Ok(builder)
}

/// Waits for the lease as `builder` says, ended early by SIGTERM, SIGINT or SIGHUP (a failure
/// with status 128+S).
pub(crate) async fn obtain(
    builder: LockBuilder,
    key: &Key,
    no_wait: bool,
    signals: &mut Forwarded,
) -> Result<LeaseGuard, Failure> {
    let guard = tokio::select! {
        biased;
        got = builder.acquire() => got.map_err(|e| not_obtained(key, e, no_wait))?,
        sig = signals.recv() => {
            return Err(Failure::new(
                signal_status(sig.signal),
                format!("{} received while waiting for the lease on {:?}", signals::name(sig.signal), key.as_str()),
            ));
        }
    };
    tracing::info!(key = %key, fence = guard.fence(), "lease acquired");
    Ok(guard)
}

/// The one line for a lease not obtained: who holds it.
fn not_obtained(key: &Key, e: Error, no_wait: bool) -> Failure {
    match e {
        Error::Timeout { holder, waited, .. } => {
            let how = if no_wait {
                "(--no-wait)".to_owned()
            } else {
                format!("after waiting {}", crate::output::duration(waited))
            };
            Failure::new(
                exit::NOT_OBTAINED,
                format!(
                    "lease on {:?} not obtained {how}: held by {}",
                    key.as_str(),
                    crate::output::clean(&holder)
                ),
            )
        }
        other => other.into(),
    }
}

/// How a command run under a lease ended.
pub(crate) enum Ended {
    /// It exited (by itself, or stopped by a signal leasehold got): leasehold's exit status, the
    /// lease released.
    Status(u8),
    /// The lease was lost, or its renewals failed past the stop-by deadline, and the command
    /// was stopped.
    Lost(StopReason),
}

/// Tells that the lease on `key` could not be released (`e`): it expires by its TTL.
pub(crate) fn release_failed(key: &Key, e: &Error) {
    exit::report(&format!(
        "cannot release the lease on {:?}: {e}; it expires by its TTL",
        key.as_str()
    ));
}

/// Holds the lease until its loss (`Ended::Lost`), or until `stop` completes: then releases it
/// and ends with 0 — or with 76 when the release finds the lease lost already (told as a `lost`
/// event), or 1 when the store could not be told (the lease then expires by its TTL). When
/// renewals fail past the stop-by deadline (the loss grace before the lease could expire), a
/// `stop` event tells whoever acts under the lease to stop now; `lost` follows at expiry.
pub(crate) async fn hold_until(
    guard: &LeaseGuard,
    key: &Key,
    events: &Events,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Ended, Failure> {
    let mut stop = std::pin::pin!(stop);
    let mut told = false;
    loop {
        tokio::select! {
            biased;
            reason = guard.lost() => return Ok(Ended::Lost(StopReason::Lost(reason))),
            why = guard.must_stop(), if !told => {
                told = true;
                if let StopReason::RenewalsFailing { valid_until } = why {
                    events.stop(key, valid_until)?;
                }
            }
            () = &mut stop => return match guard.release().await {
                Ok(leasehold::Released::Lost(reason)) => {
                    events.lost(key, &StopReason::Lost(reason))?;
                    Ok(Ended::Status(LOST))
                }
                Ok(_) => Ok(Ended::Status(OK)),
                Err(e) => {
                    release_failed(key, &e);
                    Ok(Ended::Status(exit::ERROR))
                }
            },
        }
    }
}

/// Where and how events are told.
pub(crate) struct Events {
    pub(crate) json: bool,
    /// Stdout without a command; stderr with one (stdout is the command's).
    pub(crate) to_stdout: bool,
}

impl Events {
    pub(crate) fn elected(&self, key: &Key, guard: &LeaseGuard) -> Result<(), Failure> {
        self.obtained("elected", key, guard)
    }

    /// `EVENT KEY HOLDER FENCE`: the lease on `key` was obtained.
    pub(crate) fn obtained(
        &self,
        event: &str,
        key: &Key,
        guard: &LeaseGuard,
    ) -> Result<(), Failure> {
        let holder = guard.record().holder.clone().unwrap_or_default();
        self.tell(
            json!({"event": event, "key": key.as_str(), "holder": holder, "fence": guard.fence()}),
            format!(
                "{event} {} {} {}",
                clean(key.as_str()),
                clean(&holder),
                guard.fence()
            ),
        )
    }

    /// `stop KEY MS`: renewals are failing; stop within MS milliseconds, before the lease could
    /// expire.
    pub(crate) fn stop(&self, key: &Key, valid_until: tokio::time::Instant) -> Result<(), Failure> {
        let ms = valid_until
            .saturating_duration_since(tokio::time::Instant::now())
            .as_millis();
        self.tell(
            json!({"event": "stop", "key": key.as_str(), "within_ms": ms, "reason": "renewals failing"}),
            format!("stop {} {ms}", clean(key.as_str())),
        )
    }

    /// `lost KEY REASON`.
    pub(crate) fn lost(&self, key: &Key, why: &StopReason) -> Result<(), Failure> {
        let reason = match why {
            StopReason::Lost(r) => r.to_string(),
            other => other.to_string(),
        };
        self.tell(
            json!({"event": "lost", "key": key.as_str(), "reason": &reason}),
            format!("lost {} {}", clean(key.as_str()), clean(&reason)),
        )
    }

    fn tell(&self, object: serde_json::Value, line: String) -> Result<(), Failure> {
        if !self.to_stdout {
            exit::report(&line);
            return Ok(());
        }
        if self.json {
            return print(&format!("{object}\n"));
        }
        print(&format!("{line}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn not_obtained_names_the_holder() {
        let key = Key::new("k").unwrap();
        let e = Error::Timeout {
            key: "k".into(),
            holder: "host-1-abc".into(),
            waited: Duration::from_millis(300),
        };
        let f = not_obtained(&key, e, false);
        assert_eq!(f.code, exit::NOT_OBTAINED);
        assert!(f.message.contains("held by host-1-abc"), "{}", f.message);
        assert!(f.message.contains("300ms"), "{}", f.message);
    }
}
