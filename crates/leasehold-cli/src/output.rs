//! Writing to stdout (a closed pipe is not an error) and formatting records for people.

use crate::exit::Failure;
use leasehold::{LeaseRecord, Permit, PermitKind, Permits};
use std::io::{self, Write};
use std::time::Duration;

/// Writes `text` to stdout. A reader that went away (`leasehold ls | head -1`) is not an error:
/// the rest of the output is dropped quietly.
pub(crate) fn print(text: &str) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::error(format!("cannot write to stdout: {e}"))),
    }
}

/// Writes `text` to stderr; a closed stderr loses it (nothing else can be told then).
pub(crate) fn eprint(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr
        .write_all(text.as_bytes())
        .and_then(|()| stderr.flush());
}

/// `println!` that never panics: a closed stdout drops the line ([`print`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        let _ = $crate::output::print(&format!("{}\n", format_args!($($arg)*)));
    };
}
pub(crate) use outln;

/// `eprintln!` that never panics: a closed stderr drops the line ([`eprint`]).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::eprint(&format!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use errln;

/// Writes a JSON value, pretty, with a final newline.
pub(crate) fn print_json(value: &serde_json::Value) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::error(format!("cannot format JSON: {e}")))?;
    print(&format!("{text}\n"))
}

/// A record's state at `now_ms`: `held`, `expired` (a holder that stopped renewing) or `free`.
/// A semaphore or read-write key is held while one of its permits is (its stored record names
/// no holder in its lock fields), expired when it lists only permits past their expiry.
pub(crate) fn state(r: &LeaseRecord, now_ms: u64) -> &'static str {
    if let Some(t) = &r.permits {
        return if t.holders.iter().any(|p| p.expires_ms > now_ms) {
            "held"
        } else if !t.holders.is_empty() {
            "expired"
        } else {
            "free"
        };
    }
    if r.is_held(now_ms) {
        "held"
    } else if r.token.is_some() {
        "expired"
    } else {
        "free"
    }
}

/// What a semaphore or read-write key is and how many hold it at `now_ms` (permits past their
/// expiry not counted): `semaphore 3/4 permits held`, `read-write: 2 readers`, `read-write: 1
/// writer`, `read-write: free`.
pub(crate) fn permits_summary(t: &Permits, now_ms: u64) -> String {
    let live = || t.holders.iter().filter(|p| p.expires_ms > now_ms);
    match t.kind {
        PermitKind::Semaphore { permits } => {
            let unit = if permits == 1 { "permit" } else { "permits" };
            format!("semaphore {}/{permits} {unit} held", live().count())
        }
        PermitKind::ReadWrite => {
            let writers = live().filter(|p| p.write).count();
            let readers = live().count() - writers;
            let plural = |n: usize, one: &str| {
                if n == 1 {
                    format!("1 {one}")
                } else {
                    format!("{n} {one}s")
                }
            };
            match (writers, readers) {
                (0, 0) => "read-write: free".into(),
                (0, r) => format!("read-write: {}", plural(r, "reader")),
                (w, 0) => format!("read-write: {}", plural(w, "writer")),
                (w, r) => format!(
                    "read-write: {}, {}",
                    plural(w, "writer"),
                    plural(r, "reader")
                ),
            }
        }
    }
}

/// A permit's holder for people: its id, and on a read-write key `(read)` or `(write)`.
pub(crate) fn permit_holder(t: &Permits, p: &Permit) -> String {
    match (t.kind, p.write) {
        (PermitKind::ReadWrite, true) => format!("{} (write)", clean(&p.holder)),
        (PermitKind::ReadWrite, false) => format!("{} (read)", clean(&p.holder)),
        (PermitKind::Semaphore { .. }, _) => clean(&p.holder),
    }
}

/// Unix milliseconds as RFC 3339 (UTC, milliseconds), `-` for 0 (never).
pub(crate) fn time(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    leasehold::format_ms(ms)
}

/// A duration for people: `850ms`, `29.8s`, `4m 10s`, `2h 5m 0s`.
pub(crate) fn duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let width = widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count()) + 2;
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Escapes control characters so that a cell or value stays on its line.
pub(crate) fn clean(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.escape_debug().collect()
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_millis(29_840)), "29.8s");
        assert_eq!(duration(Duration::from_millis(250_900)), "4m 10s");
        assert_eq!(time(0), "-");
        assert_eq!(time(1_000), "1970-01-01T00:00:01.000Z");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["KEY", "HOLDER"],
            &[
                vec!["a-long-key".into(), "h".into()],
                vec!["k".into(), "-".into()],
            ],
        );
        assert_eq!(t, "KEY         HOLDER\na-long-key  h\nk           -\n");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clean("a\nb"), "a\\nb");
        assert_eq!(clean("plain"), "plain");
    }
}
