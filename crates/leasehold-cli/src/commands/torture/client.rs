//! A client process of `leasehold torture`: takes leases on a few keys and writes to the fenced
//! resource under each, until killed — through the library, or through `leasehold run` with the
//! writes made by the command it runs.

use super::resource::{Resource, Role};
use super::Mode;
use crate::cli::Via;
use crate::process::group_guard::monotonic_ns;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Writes per critical section, at least, and the pause between them.
const WRITES: usize = 3;
const BETWEEN_WRITES: Duration = Duration::from_millis(2);

/// The pause between the writes of a section held for `hold`: 2 ms, or a fiftieth of `hold`.
fn between_writes(hold: Duration) -> Duration {
    BETWEEN_WRITES.max(hold / 50)
}

/// How long a client waits for a key before it picks another.
const WAIT: Duration = Duration::from_secs(2);

/// How long a client whose sections are held for `hold` waits for a key: [`WAIT`], or ten
/// sections' time (it waits behind the other clients' sections; one that gave up would leave
/// behind the grant a lost answer kept from it).
fn wait(hold: Duration) -> Duration {
    WAIT.max(hold * 10)
}

/// What one client does.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) url: &'a str,
    pub(crate) socket: &'a Path,
    pub(crate) id: &'a str,
    pub(crate) keys: usize,
    pub(crate) ttl: Duration,
    pub(crate) seed: u64,
    pub(crate) via: Via,
    /// What the keys are.
    pub(crate) mode: Mode,
    /// How long a critical section goes on writing, at least (its lease permitting): zero for
    /// a few writes.
    pub(crate) hold: Duration,
}

/// The permit a client takes next in `mode` (a writer one time in three on a read-write lock);
/// `None` for a lock.
fn pick_role(mode: Mode, rng: &mut fastrand::Rng) -> Option<Role> {
    match mode {
        Mode::Lock => None,
        Mode::Semaphore(_) => Some(Role::Permit),
        Mode::ReadWrite if rng.u32(..3) == 0 => Some(Role::Write),
        Mode::ReadWrite => Some(Role::Read),
    }
}

/// What a request of a permit holder adds to the lock's `OP KEY FENCE CLIENT VALID`: its role and
/// when it began to ask for its permit (CLOCK_MONOTONIC ns).
fn permit_suffix(permit: Option<(Role, u64)>) -> String {
    permit.map_or_else(String::new, |(role, start)| {
        format!(" {} {start}", role.as_str())
    })
}

/// Loops until the process is killed: acquire a key, enter, write while the lease is not due to
/// stop, leave, release. Store errors are retried; an unreachable resource ends the client.
pub(crate) async fn run(plan: Plan<'_>) -> Result<(), String> {
    if plan.via == Via::Run {
        return run_commands(&plan).await;
    }
    let locks = leasehold::connect(plan.url)
        .await
        .map_err(|e| format!("store: {e}"))?
        .with_holder(leasehold::HolderId::new(plan.id));
    let mut resource = Resource::connect(plan.socket).map_err(|e| format!("resource: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    loop {
        let key = format!("torture/{}", rng.usize(..plan.keys.max(1)));
        let role = pick_role(plan.mode, &mut rng);
        let builder = match (plan.mode, role) {
            (Mode::Semaphore(n), _) => locks.semaphore(&key, n),
            (Mode::ReadWrite, Some(Role::Write)) => locks.read_write(&key).map(|rw| rw.write()),
            (Mode::ReadWrite, _) => locks.read_write(&key).map(|rw| rw.read()),
            (Mode::Lock, _) => locks.lock(&key),
        }
        .map_err(|e| e.to_string())?;
        let start = monotonic_ns();
        let suffix = permit_suffix(role.map(|r| (r, start)));
        let guard = match builder.ttl(plan.ttl).wait(wait(plan.hold)).acquire().await {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(error = %e, "torture client: not acquired");
                continue;
            }
        };
        let fence = guard.fence();
        let mut say = |op: &str| -> Result<String, String> {
            let valid = crate::process::group_guard::monotonic_at(guard.valid_until());
            resource
                .ask(&format!("{op} {key} {fence} {} {valid}{suffix}", plan.id))
                .map_err(|e| format!("resource: {e}"))
        };
        if !guard.is_stop_due() && say("E")? == "ok" {
            let until = tokio::time::Instant::now() + plan.hold;
            for n in 1.. {
                // A careful holder checks its lease before each write; the fence catches a
                // holder paused between the check and the write.
                if guard.is_stop_due() {
                    say("L")?;
                    break;
                }
                if say("W")? != "ok" || (n >= WRITES && tokio::time::Instant::now() >= until) {
                    break;
                }
                tokio::time::sleep(between_writes(plan.hold)).await;
            }
        }
        say("X")?;
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "torture client: release failed");
        }
    }
}

/// The client as a loop of `leasehold run --key KEY -- leasehold __torture section …`.
async fn run_commands(plan: &Plan<'_>) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("leasehold executable: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let ttl = humantime::format_duration(plan.ttl)
        .to_string()
        .replace(' ', "");
    let wait = humantime::format_duration(wait(plan.hold))
        .to_string()
        .replace(' ', "");
    loop {
        let key = format!("torture/{}", rng.usize(..plan.keys.max(1)));
        let role = pick_role(plan.mode, &mut rng);
        let permit_flags = match (plan.mode, role) {
            (Mode::Semaphore(n), _) => vec!["--permits".to_owned(), n.to_string()],
            (Mode::ReadWrite, Some(Role::Write)) => vec!["--write".to_owned()],
            (Mode::ReadWrite, _) => vec!["--read".to_owned()],
            (Mode::Lock, _) => vec![],
        };
        let start = monotonic_ns();
        let section_permit = role
            .map(|r| vec![r.as_str().to_owned(), start.to_string()])
            .unwrap_or_default();
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(["run", "--store", plan.url, "--key", &key, "--ttl", &ttl])
            .args(&permit_flags)
            .args(["--wait", &wait, "--"])
            .arg(&exe)
            .arg(super::ARG)
            .arg("section")
            .arg(plan.socket)
            .args([key.as_str(), plan.id, &plan.hold.as_millis().to_string()])
            .args(&section_permit)
            // What it says (a command stopped at a deadline) is what the faults cause.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        crate::process::child::die_with_parent(&mut cmd);
        let status = cmd
            .status()
            .await
            .map_err(|e| format!("leasehold run: {e}"))?;
        tracing::debug!(%status, "torture client: leasehold run ended");
    }
}

/// The command a `leasehold run` client runs under its lease: enters `key`'s section with the
/// fence of `LEASEHOLD_FENCE`, writes, leaves. Its section lasts while its process lives, and its
/// lease is valid until `LEASEHOLD_DEADLINE`, by which `leasehold run` (or its group guard, when
/// `run` is paused) kills it: a section alive past it is a late holder (its killer was starved),
/// one alive when another client enters before it an overlap. It goes on writing for `hold`
/// (at least a few writes), but not past `LEASEHOLD_DEADLINE`. `permit`: the role of the permit
/// it runs under and when its `leasehold run` began to ask for it.
pub(crate) fn section(
    socket: &Path,
    key: &str,
    id: &str,
    hold: Duration,
    permit: Option<(Role, u64)>,
) -> Result<(), String> {
    let number = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("{name} is not a number: run me under leasehold run"))
    };
    let fence = number("LEASEHOLD_FENCE")?;
    let deadline = number("LEASEHOLD_DEADLINE")?;
    let mut resource = Resource::connect(socket).map_err(|e| format!("resource: {e}"))?;
    let suffix = permit_suffix(permit);
    let mut say = |op: &str| -> Result<String, String> {
        resource
            .ask(&format!("{op} {key} {fence} {id} {deadline}{suffix}"))
            .map_err(|e| format!("resource: {e}"))
    };
    if say("E")? == "ok" {
        let until = std::time::Instant::now() + hold;
        for n in 1.. {
            if say("W")? != "ok"
                || (n >= WRITES && std::time::Instant::now() >= until)
                || (n >= WRITES && monotonic_ns() >= deadline)
            {
                break;
            }
            std::thread::sleep(between_writes(hold));
        }
    }
    say("X")?;
    Ok(())
}
