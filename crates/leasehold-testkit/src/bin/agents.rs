//! The seed workload: one trading agent in exactly one pod.
//!
//! `leasehold-agents STORE_URL [AGENTS] [TTL_MS] [RETRY_MS] [DEADLINE_MS]`
//!
//! Every process tries, each retry period, to claim every agent id of the list (`agent-0` …)
//! with `try_acquire`: it runs the agents it got and skips the rest. An agent runs until its lease
//! is lost or the process is told to stop. On SIGTERM the process stops its agents (each gets
//! `DEADLINE_MS`, default 25 s), releases its leases and exits 0; the other processes take the
//! orphaned agents over at their next retry. A process killed with SIGKILL loses its agents to the
//! others when the TTL runs out.
//!
//! Events go to stdout, one per line, with CLOCK_MONOTONIC nanoseconds (comparable across the
//! processes of one host): `start AGENT FENCE NS`, `stop AGENT REASON NS`, `exit NS`.

use leasehold::Locks;
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;
use tokio::sync::watch;

fn event(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line} {}", leasehold_testkit::mono_ns());
    let _ = out.flush();
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: leasehold-agents STORE_URL [AGENTS] [TTL_MS] [RETRY_MS] [DEADLINE_MS]");
        std::process::exit(2);
    };
    let (agents, ttl, retry, deadline) = (arg(2, 20), arg(3, 30_000), arg(4, 1000), arg(5, 25_000));
    let locks: Locks = match leasehold::connect(&url).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("leasehold-agents: {e}");
            std::process::exit(1);
        }
    };
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("leasehold-agents: {e}");
            std::process::exit(1);
        }
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut running: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(retry));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = term.recv() => break,
        }
        running.retain(|_, h| !h.is_finished());
        for i in 0..agents {
            let id = format!("agent-{i}");
            if running.contains_key(&id) {
                continue;
            }
            let lock = match locks.lock(format!("agent:{id}")) {
                Ok(l) => l.ttl(Duration::from_millis(ttl)).label("agent", id.clone()),
                Err(e) => {
                    eprintln!("leasehold-agents: {e}");
                    continue;
                }
            };
            match lock.try_acquire().await {
                Ok(Some(guard)) => {
                    event(format!("start {id} {}", guard.fence()));
                    let mut stop = stop_rx.clone();
                    let agent = id.clone();
                    running.insert(
                        id,
                        tokio::spawn(async move {
                            let reason = tokio::select! {
                                r = guard.lost() => format!("lost:{}", r.to_string().replace(' ', "_")),
                                _ = stop.wait_for(|s| *s) => {
                                    // The agent's own shutdown work would go here.
                                    "shutdown".to_owned()
                                }
                            };
                            event(format!("stop {agent} {reason}"));
                            let _ = guard.release().await;
                        }),
                    );
                }
                Ok(None) => {}
                Err(e) => eprintln!("leasehold-agents: {id}: {e}"),
            }
        }
    }
    // Graceful shutdown: stop the agents within the deadline, release everything, exit.
    let _ = stop_tx.send(true);
    let all = futures_join(running.into_values().collect());
    if tokio::time::timeout(Duration::from_millis(deadline), all)
        .await
        .is_err()
    {
        eprintln!("leasehold-agents: agents did not stop within {deadline} ms; releasing anyway");
    }
    if let Err(e) = locks.release_all().await {
        eprintln!("leasehold-agents: release: {e}");
    }
    event("exit".to_owned());
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}
