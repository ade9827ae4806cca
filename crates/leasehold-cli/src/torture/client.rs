//! A client process of `leasehold torture`: takes leases on a few keys through the library and
//! writes to the fenced resource under each, until killed.

use super::resource::Resource;
use std::path::Path;
use std::time::Duration;

/// Writes per critical section, and the pause between them.
const WRITES: usize = 3;
const BETWEEN_WRITES: Duration = Duration::from_millis(2);

/// What one client does.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) url: &'a str,
    pub(crate) socket: &'a Path,
    pub(crate) id: &'a str,
    pub(crate) keys: usize,
    pub(crate) ttl: Duration,
    pub(crate) seed: u64,
}

/// Loops until the process is killed: acquire a key, enter, write while the lease is not due to
/// stop, leave, release. Store errors are retried; an unreachable resource ends the client.
pub(crate) async fn run(plan: Plan<'_>) -> Result<(), String> {
    let locks = leasehold::connect(plan.url)
        .await
        .map_err(|e| format!("store: {e}"))?
        .with_holder(leasehold::HolderId::new(plan.id));
    let mut resource = Resource::connect(plan.socket).map_err(|e| format!("resource: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    loop {
        let key = format!("torture/{}", rng.usize(..plan.keys.max(1)));
        let builder = locks.lock(&key).map_err(|e| e.to_string())?;
        let guard = match builder
            .ttl(plan.ttl)
            .wait(Duration::from_secs(2))
            .acquire()
            .await
        {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(error = %e, "torture client: not acquired");
                continue;
            }
        };
        let fence = guard.fence();
        let mut say = |op: &str| -> Result<String, String> {
            let valid = crate::guard::monotonic_at(guard.valid_until());
            resource
                .ask(&format!("{op} {key} {fence} {} {valid}", plan.id))
                .map_err(|e| format!("resource: {e}"))
        };
        if !guard.is_stop_due() && say("E")? == "ok" {
            for _ in 0..WRITES {
                // A careful holder checks its lease before each write; the fence catches a
                // holder paused between the check and the write.
                if guard.is_stop_due() {
                    break;
                }
                if say("W")? != "ok" {
                    break;
                }
                tokio::time::sleep(BETWEEN_WRITES).await;
            }
        }
        say("X")?;
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "torture client: release failed");
        }
    }
}
