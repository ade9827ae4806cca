//! `leasehold elect`: leader election over any store. A candidate campaigns for the lease on a key
//! (waiting for it forever, registered as its waiter), leads while it holds it, and campaigns
//! again when it loses it (unless `--once`).
//!
//! Without a command the leader only holds the lease, until a termination signal; its events go to
//! stdout, one line each, for a script or a supervisor to follow. With a command the leader runs
//! it as `leasehold run` does ([`crate::run::supervise`]): the command's exit ends the election
//! (the lease released, leasehold exiting with its status), a lost lease stops it.

use crate::admin::key_arg;
use crate::cli::ElectArgs;
use crate::exit::{self, Failure, LOST, OK};
use crate::metrics::{self, Endpoint};
use crate::output::{clean, print};
use crate::run::{self, Ended, Supervised};
use crate::signals::{self, Forwarded};
use leasehold::{Key, LeaseGuard, LostReason, Wait};
use prometheus::IntGauge;
use serde_json::json;

/// `leasehold elect`.
pub(crate) async fn elect(store_url: Option<&str>, args: ElectArgs) -> Result<u8, Failure> {
    let key = key_arg(&args.key)?;
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let endpoint = Endpoint::given(args.metrics);
    let locks = metrics::locks(store_url, endpoint.as_ref()).await?;
    let leader = IntGauge::new("leasehold_leader", "1 while this candidate leads, else 0")
        .map_err(metrics::setup_failed)?;
    if let Some(e) = &endpoint {
        e.registry
            .register(Box::new(leader.clone()))
            .map_err(metrics::setup_failed)?;
    }
    Endpoint::serve_given(endpoint).await?;
    let command = args
        .command
        .split_first()
        .map(|(program, rest)| Supervised {
            program,
            args: rest,
            grace: args.grace,
            on_handoff: None,
        });
    let events = Events {
        json: args.json,
        to_stdout: command.is_none(),
    };
    loop {
        let mut builder = locks
            .lock_key(key.clone())
            .ttl(args.ttl)
            .wait_policy(Wait::Forever);
        for (name, value) in &args.labels {
            builder = builder.label(name, value);
        }
        let guard = run::obtain(builder, &key, false, &mut signals).await?;
        leader.set(1);
        events.elected(&key, &guard)?;
        let ended = match &command {
            Some(command) => run::supervise(&locks, &guard, &key, command, &mut signals).await?,
            None => {
                let stop = async {
                    let sig = signals.recv().await;
                    tracing::info!(key = %key, signal = %signals::name(sig.signal), "stepping down");
                };
                hold_until(&guard, &key, &events, stop).await?
            }
        };
        leader.set(0);
        match ended {
            Ended::Status(code) => return Ok(code),
            Ended::Lost(reason) => {
                events.lost(&key, &reason)?;
                if args.once {
                    return Ok(LOST);
                }
            }
        }
    }
}

/// Holds the lease until its loss (`Ended::Lost`), or until `stop` completes: then releases it
/// and ends with 0 — or with 76 when the release finds the lease lost already (told as a `lost`
/// event), or 1 when the store could not be told (the lease then expires by its TTL).
pub(crate) async fn hold_until(
    guard: &LeaseGuard,
    key: &Key,
    events: &Events,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Ended, Failure> {
    tokio::select! {
        reason = guard.lost() => Ok(Ended::Lost(reason)),
        () = stop => match guard.release().await {
            Ok(leasehold::Released::Lost(reason)) => {
                events.lost(key, &reason)?;
                Ok(Ended::Status(LOST))
            }
            Ok(_) => Ok(Ended::Status(OK)),
            Err(e) => {
                run::release_failed(key, &e);
                Ok(Ended::Status(exit::ERROR))
            }
        },
    }
}

/// Where and how events are told.
pub(crate) struct Events {
    pub(crate) json: bool,
    /// Stdout without a command; stderr with one (stdout is the command's).
    pub(crate) to_stdout: bool,
}

impl Events {
    fn elected(&self, key: &Key, guard: &LeaseGuard) -> Result<(), Failure> {
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

    /// `lost KEY REASON`.
    pub(crate) fn lost(&self, key: &Key, reason: &LostReason) -> Result<(), Failure> {
        self.tell(
            json!({"event": "lost", "key": key.as_str(), "reason": reason.to_string()}),
            format!(
                "lost {} {}",
                clean(key.as_str()),
                clean(&reason.to_string())
            ),
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
