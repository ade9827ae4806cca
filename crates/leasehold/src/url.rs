//! What every store URL shares, at the bottom of the crate: hiding its credentials ([`redact`]),
//! durations with a 100-year cap ([`duration`]), and the typed reader of its query parameters
//! ([`Params`]) through which every store reads its own and which refuses any it does not know.
//! It uses nothing else of the crate but [`Error`].

use crate::error::{Error, Result};
use std::time::Duration;

/// The longest duration a URL parameter may give (`?timeout=`, `?max_clock_skew=` …): 100 years.
/// Deadlines are the monotonic clock plus a multiple of a duration, and times in milliseconds
/// fit a `u64`: a longer duration would overflow them.
pub(crate) const LONGEST_DURATION: Duration = Duration::from_secs(100 * 31_557_600); // `100y`: humantime's years are 365.25 days

/// A duration as a URL parameter gives it (`500ms`, `2s`, `1h 30m`), at most
/// [`LONGEST_DURATION`]; the error says why not.
pub(crate) fn duration(v: &str) -> std::result::Result<Duration, String> {
    let d = humantime::parse_duration(v).map_err(|e| e.to_string())?;
    if d > LONGEST_DURATION {
        return Err("longer than 100 years".into());
    }
    Ok(d)
}

/// Hides a URL's passwords for messages ([`crate::redact_url`]): `user:password@` and a `pass=`,
/// `password=` or `sentinel_pass=` query parameter show as `***`.
pub(crate) fn redact(url: &str) -> String {
    let (main, query) = match url.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (url, None),
    };
    let main = match ::url::Url::parse(main) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        // Not a URL the parser takes (several hosts): whatever precedes an `@` goes.
        Err(_) => match (main.find("://"), main.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***{}", &main[..s + 3], &main[at..]),
            _ => main.to_owned(),
        },
    };
    let Some(query) = query else { return main };
    // Names as the stores read them: percent-decoded (`pa%73s` is `pass`).
    let secret = |k: &str| {
        let k: String = ::url::form_urlencoded::parse(k.as_bytes())
            .map(|(k, v)| k.into_owned() + &v)
            .collect();
        matches!(k.as_str(), "pass" | "password" | "sentinel_pass")
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if secret(k) => format!("{k}=***"),
            // A secret's name without `=` shows as hidden too, as every secret parameter does.
            None if secret(pair) => format!("{pair}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{main}?{}", pairs.join("&"))
}

/// An [`Error::InvalidUrl`] for `url` (redacted here) and `reason`.
pub(crate) fn invalid(url: &str, reason: impl Into<String>) -> Error {
    Error::InvalidUrl {
        url: redact(url),
        reason: reason.into(),
    }
}

/// `e` as the fault of `url`: an [`Error::InvalidOption`] becomes an [`Error::InvalidUrl`]
/// naming the URL and the option (the URL gave the option); any other error is kept.
pub(crate) fn option_error_in(url: &str, e: Error) -> Error {
    match e {
        Error::InvalidOption { name, reason } => invalid(url, format!("{name}: {reason}")),
        e => e,
    }
}

/// Parses a URL the `url` crate understands (one host), as the stores that take one need.
pub(crate) fn parse(url: &str) -> Result<::url::Url> {
    ::url::Url::parse(url).map_err(|e| invalid(url, e.to_string()))
}

/// The scheme of a URL, lower case, if it has the `SCHEME://` shape.
pub(crate) fn scheme_of(url: &str) -> Option<String> {
    let (s, _) = url.split_once("://")?;
    let ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    ok.then(|| s.to_ascii_lowercase())
}

/// One `name=value` of a query.
struct Pair {
    /// The name, percent-decoded.
    name: String,
    /// The value, percent-decoded.
    value: String,
    /// `name=value` as written.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    // their readers'
    raw: String,
    /// Whether a reader took it.
    taken: bool,
}

/// The query parameters of a store URL, read by name: each `take_*` takes every occurrence of a
/// name (the last one's value counts) and remembers the name as known; [`Params::finish`] then
/// refuses any parameter left, naming the known ones. Errors name the URL without its secrets.
pub(crate) struct Params {
    /// The URL, redacted, for errors.
    shown: String,
    pairs: Vec<Pair>,
    /// The names asked for, in order, for [`Params::finish`]'s message.
    known: Vec<&'static str>,
}

impl std::fmt::Debug for Params {
    /// The URL redacted and the parameters' names: never a value (a password may be one).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.pairs.iter().map(|p| p.name.as_str()).collect();
        f.debug_struct("Params")
            .field("url", &self.shown)
            .field("names", &names)
            .finish()
    }
}

// Some readers are only the optional stores'.
#[cfg_attr(
    not(all(feature = "redis", feature = "postgres", feature = "etcd")),
    allow(dead_code)
)]
impl Params {
    /// The parameters of a parsed URL.
    pub(crate) fn new(url: &::url::Url) -> Self {
        Self::of_query(url.as_str(), url.query().unwrap_or_default())
    }

    /// The parameters of `query` (what follows `?`), of a URL the `url` crate may not take
    /// (several hosts); `url` names it in errors.
    pub(crate) fn of_query(url: &str, query: &str) -> Self {
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|raw| {
                let (name, value) = ::url::form_urlencoded::parse(raw.as_bytes())
                    .next()
                    .map(|(n, v)| (n.into_owned(), v.into_owned()))
                    .unwrap_or_default();
                Pair {
                    name,
                    value,
                    raw: raw.to_owned(),
                    taken: false,
                }
            })
            .collect();
        Params {
            shown: redact(url),
            pairs,
            known: vec![],
        }
    }

    /// The parameters of the URL `url`, whatever its shape: what follows its first `?`.
    pub(crate) fn of_url(url: &str) -> Self {
        Self::of_query(url, url.split_once('?').map_or("", |(_, q)| q))
    }

    /// An [`Error::InvalidUrl`] for this URL.
    pub(crate) fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidUrl {
            url: self.shown.clone(),
            reason: reason.into(),
        }
    }

    /// The URL, redacted, as errors name it.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// The value of `name` (the last one given), taken.
    pub(crate) fn take_str(&mut self, name: &'static str) -> Option<String> {
        if !self.known.contains(&name) {
            self.known.push(name);
        }
        let mut value = None;
        for p in self.pairs.iter_mut().filter(|p| p.name == name) {
            p.taken = true;
            value = Some(p.value.clone());
        }
        value
    }

    /// `name` as a file path.
    pub(crate) fn take_path(&mut self, name: &'static str) -> Option<std::path::PathBuf> {
        self.take_str(name).map(Into::into)
    }

    /// `name` as a duration ([`duration`]: at most 100 years).
    pub(crate) fn take_duration(&mut self, name: &'static str) -> Result<Option<Duration>> {
        let Some(v) = self.take_str(name) else {
            return Ok(None);
        };
        duration(&v).map(Some).map_err(|e| {
            self.invalid(format!(
                "{name} {v:?}: expected a duration such as 2s or 500ms ({e})"
            ))
        })
    }

    /// `name` as a duration above zero.
    pub(crate) fn take_positive_duration(
        &mut self,
        name: &'static str,
    ) -> Result<Option<Duration>> {
        let Some(v) = self.take_str(name) else {
            return Ok(None);
        };
        match duration(&v) {
            Ok(d) if !d.is_zero() => Ok(Some(d)),
            Ok(_) => Err(self.invalid(format!(
                "{name} {v:?}: expected a duration above zero, such as 2s or 500ms"
            ))),
            Err(e) => Err(self.invalid(format!(
                "{name} {v:?}: expected a duration such as 2s or 500ms ({e})"
            ))),
        }
    }

    /// `name` as `true`/`false` (also `1`/`0`, `yes`/`no`).
    pub(crate) fn take_bool(&mut self, name: &'static str) -> Result<Option<bool>> {
        let Some(v) = self.take_str(name) else {
            return Ok(None);
        };
        match v.as_str() {
            "true" | "1" | "yes" => Ok(Some(true)),
            "false" | "0" | "no" => Ok(Some(false)),
            _ => Err(self.invalid(format!("{name} {v:?}: expected true or false"))),
        }
    }

    /// `name` as a whole number; `what` says what it counts, for the error.
    pub(crate) fn take_u64(&mut self, name: &'static str, what: &str) -> Result<Option<u64>> {
        let Some(v) = self.take_str(name) else {
            return Ok(None);
        };
        v.parse()
            .map(Some)
            .map_err(|_| self.invalid(format!("{name} {v:?}: expected a whole number of {what}")))
    }

    /// The adapter's `max_clock_skew`, common to the stores over records (default
    /// [`crate::options::DEFAULT_MAX_CLOCK_SKEW`]).
    pub(crate) fn take_max_clock_skew(&mut self) -> Result<Duration> {
        Ok(self
            .take_duration("max_clock_skew")?
            .unwrap_or(crate::options::DEFAULT_MAX_CLOCK_SKEW))
    }

    /// Offers each parameter not yet taken, as written (`name=value`), to `take`, which answers
    /// whether it took it (for readers of their own, as PostgreSQL's TLS parameters).
    pub(crate) fn take_raw(&mut self, mut take: impl FnMut(&str) -> Result<bool>) -> Result<()> {
        for p in self.pairs.iter_mut().filter(|p| !p.taken) {
            p.taken = take(&p.raw)?;
        }
        Ok(())
    }

    /// Takes the parameters named `names` as they are written, for a reader further on (the
    /// redis crate's `db` of a Unix socket URL): joined by `&`, `None` when none is given.
    pub(crate) fn keep(&mut self, names: &[&str]) -> Option<String> {
        let kept: Vec<&str> = self
            .pairs
            .iter_mut()
            .filter(|p| !p.taken && names.contains(&p.name.as_str()))
            .map(|p| {
                p.taken = true;
                p.raw.as_str()
            })
            .collect();
        (!kept.is_empty()).then(|| kept.join("&"))
    }

    /// The parameters not taken, as written, joined by `&` (`None` when none is left): for a
    /// driver that reads the rest.
    pub(crate) fn rest(&self) -> Option<String> {
        let rest: Vec<&str> = self
            .pairs
            .iter()
            .filter(|p| !p.taken)
            .map(|p| p.raw.as_str())
            .collect();
        (!rest.is_empty()).then(|| rest.join("&"))
    }

    /// Refuses any parameter no reader took: `unknown parameter "x" (known: …)`, the known ones
    /// being those asked for.
    pub(crate) fn finish(self) -> Result<()> {
        self.finish_noting("")
    }

    /// [`Params::finish`], with `note` after the known names (`; db, user, pass for …`).
    pub(crate) fn finish_noting(self, note: &str) -> Result<()> {
        match self.pairs.iter().find(|p| !p.taken) {
            None => Ok(()),
            Some(p) => Err(self.invalid(format!(
                "unknown parameter {:?} (known: {}{note})",
                p.name,
                match self.known.is_empty() {
                    true => "none".to_owned(),
                    false => self.known.join(", "),
                }
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(e: Error) -> String {
        match e {
            Error::InvalidUrl { reason, .. } => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parameters_are_read_by_type_and_the_rest_refused() {
        let mut p = Params::of_url(
            "x://u:hunter2@h/?timeout=2s&on=yes&n=3&name=a%20b&timeout=3s&pass=hunter2&bogus",
        );
        assert_eq!(
            p.take_duration("timeout").ok().flatten(),
            Some(Duration::from_secs(3))
        );
        assert_eq!(p.take_bool("on").ok().flatten(), Some(true));
        assert_eq!(p.take_u64("n", "things").ok().flatten(), Some(3));
        assert_eq!(p.take_str("name").as_deref(), Some("a b"));
        assert_eq!(p.take_str("absent"), None);
        assert_eq!(p.rest().as_deref(), Some("pass=hunter2&bogus"));
        let _ = p.take_str("pass");
        let e = p.finish().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("unknown parameter \"bogus\" (known: timeout, on, n, name, absent, pass)"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn bad_values_say_which_and_why() {
        let mut p = Params::of_url("x://h?t=soon&z=0s&b=maybe&n=-1&long=101y");
        let e = |r: Result<Option<Duration>>| r.err().map(reason).unwrap_or_default();
        assert!(e(p.take_duration("t")).starts_with("t \"soon\": expected a duration"));
        assert!(e(p.take_positive_duration("z")).contains("above zero"));
        assert!(e(p.take_duration("long")).contains("longer than 100 years"));
        let b = p.take_bool("b").err().map(reason).unwrap_or_default();
        assert!(b.contains("expected true or false"), "{b}");
        let n = p.take_u64("n", "replicas").err().map(reason);
        assert!(n.is_some_and(|n| n.contains("whole number of replicas")));
        assert!(p.finish().is_ok());
    }

    #[test]
    fn durations_stop_at_100_years() {
        assert_eq!(duration("100y"), Ok(LONGEST_DURATION));
        assert!(duration("101y")
            .err()
            .is_some_and(|e| e.contains("100 years")));
    }
}
