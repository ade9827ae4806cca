//! Exit codes and the one error type of the command line.

use std::fmt;

/// Success (for `run`: the command's own status 0).
pub(crate) const OK: u8 = 0;
/// An error: store failure, no such record, corrupt record, I/O.
pub(crate) const ERROR: u8 = 1;
/// A usage error: bad option, store URL, key or duration.
pub(crate) const USAGE: u8 = 2;
/// `run`: the command could not be executed (found, but not executable).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// `run`: the command was not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// `run`: the lease was not obtained in time (`EX_TEMPFAIL`: try again later).
pub(crate) const NOT_OBTAINED: u8 = 75;
/// `run`: the lease was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// Added to a signal number for a process that a signal ended, as shells do.
pub(crate) const SIGNAL_BASE: u8 = 128;

/// The exit-code table of `--help`.
pub(crate) const HELP: &str = "\
Exit status:
  0    success
  1    error (store failure, no record to inspect, corrupt record)
  2    usage error (bad option, store URL, key or duration)
  75   run, hold: the lease was not obtained (held elsewhere with --no-wait, or --wait ran out)
  76   run, hold, elect --once: the lease was lost (a command running under it was stopped)
  126  run, elect: the command could not be executed
  127  run, elect: the command was not found
  N    run, elect: otherwise the command's own exit status, 128+S if signal S ended it;
       128+S also when signal S ends a wait for the lease

Environment:
  LEASEHOLD_STORE  the store URL when --store is not given
  LEASEHOLD_QUEUE  the queue URL when --queue is not given
  LEASEHOLD_LOG    log filter for messages on stderr (default: leasehold's own warnings),
                   e.g. debug (dependencies' messages too), leasehold=trace";

/// Why the command line stops early: one line for stderr and an exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The exit code.
    pub(crate) code: u8,
    /// The message, one line, without the `leasehold: ` prefix.
    pub(crate) message: String,
}

impl Failure {
    /// A failure with this exit code.
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: one_line(&message.into()),
        }
    }

    /// An error (exit 1).
    pub(crate) fn error(message: impl Into<String>) -> Self {
        Self::new(ERROR, message)
    }

    /// A usage error (exit 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<leasehold::Error> for Failure {
    /// Input errors (key, URL, option, store not compiled in) are usage errors; a timeout is
    /// "lease not obtained"; everything else is an error.
    fn from(e: leasehold::Error) -> Self {
        use leasehold::Error as E;
        let code = match &e {
            E::InvalidKey { .. }
            | E::InvalidUrl { .. }
            | E::InvalidOption { .. }
            | E::FeatureNotEnabled { .. } => USAGE,
            E::Timeout { .. } => NOT_OBTAINED,
            _ => ERROR,
        };
        Failure::new(code, e.to_string())
    }
}

/// Prints `leasehold: MESSAGE` on stderr (a closed stderr is ignored).
pub(crate) fn report(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "leasehold: {}", one_line(message));
}

/// Prints a command-line parsing error and returns the exit code. Help and version go to stdout
/// (exit 0). A value that does not parse (a duration, a label, a signal) is reported on one line;
/// other usage errors keep clap's message with the usage.
pub(crate) fn clap_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind as K;
    match e.kind() {
        K::ValueValidation | K::InvalidValue | K::InvalidUtf8 => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or_default();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            // A value outside a fixed set: say which it takes.
            match text
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("[possible values:"))
            {
                Some(values) => report(&format!("{first} {values}")),
                None => report(first),
            }
            USAGE
        }
        _ => {
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(USAGE)
        }
    }
}

/// Folds a message onto one line (errors from deep down may carry newlines).
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, part) in s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_exit_codes() {
        let key = leasehold::Key::new("").unwrap_err();
        assert_eq!(Failure::from(key).code, USAGE);
        let timeout = leasehold::Error::Timeout {
            key: "k".into(),
            holder: "h".into(),
            waited: std::time::Duration::ZERO,
        };
        assert_eq!(Failure::from(timeout).code, NOT_OBTAINED);
        let down = leasehold::Error::Unavailable {
            store: "s".into(),
            detail: "d".into(),
            source: None,
        };
        assert_eq!(Failure::from(down).code, ERROR);
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(Failure::error("a\n\n  b  \n").message, "a; b");
    }
}
