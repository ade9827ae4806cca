//! The `clock` fault of `leasehold torture`: clients whose wall clock is minutes ahead or behind
//! the host's, through libfaketime (Debian package `faketime`) preloaded into the client process.
//! Only the wall clock moves: `FAKETIME_DONT_FAKE_MONOTONIC=1` leaves CLOCK_MONOTONIC and
//! CLOCK_BOOTTIME alone, so the `valid_until` a client reports to the resource stays on the
//! host's monotonic clock (checked before each phase: [`check`]).
//!
//! The library is preloaded directly (`LD_PRELOAD`), not through the `faketime` wrapper: the
//! wrapper names a semaphore after its pid in /dev/shm, which a SIGKILLed wrapper leaves behind.

use crate::exit::{Failure, ERROR};
use leasehold::ExpiryClock;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::process::Command;

/// The skews given in turn: two minutes ahead, two minutes behind. Two clients' clocks then
/// differ by at most four minutes, within the five minutes the record adapter assumes at most
/// by default (`max_clock_skew`); clocks further apart than that bound let a contender whose
/// clock is ahead take a lease still held, as that bound's documentation says.
pub(crate) const SKEWS: [&str; 2] = ["+2m", "-2m"];

/// The skews on stores whose expiry reads no client's wall clock, only the server's dates
/// (`Date` and `Last-Modified`) and observation (S3, Azure Blob, Cloud Storage: their
/// [`ExpiryClock::ServerDates`]): an hour ahead and an hour behind, far past any assumed bound.
pub(crate) const SERVER_CLOCK_SKEWS: [&str; 2] = ["+1h", "-1h"];

/// The skews the clock fault gives the clients of a store whose expiry `clock` judges.
pub(crate) fn skews(clock: ExpiryClock) -> [&'static str; 2] {
    match clock {
        ExpiryClock::ServerDates => SERVER_CLOCK_SKEWS,
        _ => SKEWS,
    }
}

/// How `leasehold __torture open` tells the harness whose clock judges the store's expiry.
pub(crate) fn word(clock: ExpiryClock) -> &'static str {
    match clock {
        ExpiryClock::Host => "host",
        ExpiryClock::Server => "server",
        ExpiryClock::ServerDates => "server-dates",
        _ => "clients",
    }
}

/// Read back from [`word`].
pub(crate) fn from_word(word: &str) -> Option<ExpiryClock> {
    [
        ExpiryClock::Host,
        ExpiryClock::Server,
        ExpiryClock::ServerDates,
        ExpiryClock::Clients,
    ]
    .into_iter()
    .find(|c| self::word(*c) == word)
}

/// The hidden `__torture` subcommand that prints this process's clocks.
pub(crate) const CLOCKS: &str = "clocks";

/// libfaketime's multi-threaded build for this machine (`/usr/lib/*/faketime/`).
fn libfaketime() -> Result<PathBuf, Failure> {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| {
            ["libfaketimeMT.so.1", "libfaketime.so.1"].map(|f| d.path().join("faketime").join(f))
        })
        .find(|p| p.exists())
        .ok_or_else(|| {
            Failure::new(
                ERROR,
                "the clock fault needs libfaketime, not found under /usr/lib/*/faketime/: install it (apt-get install faketime)",
            )
        })
}

/// The environment that runs a process with its wall clock moved by `skew` (libfaketime
/// syntax, e.g. `+5m`).
pub(crate) fn env(skew: &str) -> Result<Vec<(&'static str, String)>, Failure> {
    let lib = libfaketime()?;
    // libfaketime's leftovers of dead processes would make some new ones fail to start (the
    // sweep is the launchers', absent from a build without them).
    #[cfg(feature = "torture")]
    leasehold_servers::sweep_faketime_leftovers();
    Ok(vec![
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME", skew.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
    ])
}

/// `skew` in seconds (`+5m` → 300, `-5m` → −300).
fn seconds(skew: &str) -> i64 {
    let (sign, rest) = match skew.strip_prefix('-') {
        Some(r) => (-1, r),
        None => (1, skew.trim_start_matches('+')),
    };
    let (n, unit) = rest.split_at(rest.len().saturating_sub(1));
    let n: i64 = n.parse().unwrap_or(0);
    sign * n
        * match unit {
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => 1,
        }
}

/// `leasehold __torture clocks`: prints CLOCK_REALTIME, CLOCK_MONOTONIC and CLOCK_BOOTTIME in
/// nanoseconds, on one line.
pub(crate) fn print() -> Result<(), String> {
    let realtime = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_nanos();
    crate::output::outln!(
        "{realtime} {} {}",
        crate::process::group_guard::monotonic_ns(),
        boottime_ns()
    );
    Ok(())
}

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the timespec we own; CLOCK_BOOTTIME exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Runs `leasehold __torture clocks` with the wall clock moved by `skew`, and checks that its
/// wall clock is moved by that much while its monotonic and boot-time clocks read as this
/// process's: a clock fault that moved nothing would prove nothing, and a moved monotonic clock
/// would make the resource misjudge the client's `valid_until`.
pub(crate) async fn check(skew: &str) -> Result<(), Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(ERROR, format!("cannot find the leasehold executable: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.arg(super::ARG)
        .arg(CLOCKS)
        .envs(env(skew)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    crate::process::child::die_with_parent(&mut cmd);
    let wall_before = SystemTime::now();
    let (mono_before, boot_before) = (crate::process::group_guard::monotonic_ns(), boottime_ns());
    let out = cmd
        .output()
        .await
        .map_err(|e| Failure::new(ERROR, format!("cannot start a clock-skewed process: {e}")))?;
    let (mono_after, boot_after) = (crate::process::group_guard::monotonic_ns(), boottime_ns());
    let text = String::from_utf8_lossy(&out.stdout);
    let read: Vec<i128> = text
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let [wall, mono, boot] = read.as_slice() else {
        return Err(Failure::new(
            ERROR,
            format!("a process under libfaketime ({skew}) printed {text:?} for its clocks"),
        ));
    };
    let before = wall_before
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(0));
    let moved = (wall - before) / 1_000_000_000;
    // The process ran within seconds, so its wall clock is the skew off, give or take that.
    if (moved - i128::from(seconds(skew))).abs() > 10 {
        return Err(Failure::new(
            ERROR,
            format!("libfaketime ({skew}) moved a process's wall clock by {moved} s: the clock fault would test nothing"),
        ));
    }
    let within = |v: i128, lo: u64, hi: u64| (i128::from(lo)..=i128::from(hi)).contains(&v);
    if !within(*mono, mono_before, mono_after) || !within(*boot, boot_before, boot_after) {
        return Err(Failure::new(
            ERROR,
            format!("libfaketime ({skew}) moved a process's monotonic or boot-time clock: CLOCK_MONOTONIC {mono} not in [{mono_before}, {mono_after}] or CLOCK_BOOTTIME {boot} not in [{boot_before}, {boot_after}]"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_judged_by_the_servers_dates_get_an_hour() {
        assert_eq!(skews(ExpiryClock::ServerDates), SERVER_CLOCK_SKEWS);
        for clock in [ExpiryClock::Host, ExpiryClock::Server, ExpiryClock::Clients] {
            assert_eq!(skews(clock), SKEWS);
            assert_eq!(from_word(word(clock)), Some(clock));
        }
        assert_eq!(from_word("sundial"), None);
    }

    #[test]
    fn skews_read_as_seconds() {
        assert_eq!(seconds("+5m"), 300);
        assert_eq!(seconds("-5m"), -300);
        assert_eq!(seconds("90s"), 90);
        assert_eq!(seconds("-1h"), -3600);
    }
}
