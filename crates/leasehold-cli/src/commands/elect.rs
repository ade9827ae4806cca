//! `leasehold elect`: leader election over any store. A candidate campaigns for the lease on a key
//! (waiting for it forever, registered as its waiter), leads while it holds it, and campaigns
//! again when it loses it (unless `--once`).
//!
//! Without a command the leader only holds the lease, until a termination signal; its events go to
//! stdout, one line each, for a script or a supervisor to follow. With a command the leader runs
//! it as `leasehold run` does ([`crate::process::under_lease::supervise`]): the command's exit ends the election
//! (the lease released, leasehold exiting with its status), a lost lease stops it.

use crate::cli::ElectArgs;
use crate::exit::{Failure, LOST};
use crate::lease::{hold_until, obtain, Ended, Events};
use crate::metrics::{self, Endpoint};
use crate::process::signals::{self, Forwarded};
use crate::process::under_lease::{supervise, Supervised};
use crate::valid::Held;
use leasehold::Wait;
use prometheus::IntGauge;

/// `leasehold elect`.
pub(crate) async fn elect(
    store_url: Option<&str>,
    args: ElectArgs,
    held: Held,
) -> Result<u8, Failure> {
    let (key, loss) = (held.key, held.loss);
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
            loss,
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
            .loss_grace(held.lease_loss_grace)
            .wait_policy(Wait::Forever);
        for (name, value) in &args.labels {
            builder = builder.label(name, value);
        }
        let guard = obtain(builder, &key, false, &mut signals).await?;
        leader.set(1);
        events.elected(&key, &guard)?;
        let ended = match &command {
            Some(command) => supervise(&locks, &guard, &key, command, &mut signals).await?,
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
