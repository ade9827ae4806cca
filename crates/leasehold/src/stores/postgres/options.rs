//! The lock store's own URL parameters: `schema` and `table`, and `mode`, whose only value is
//! `table` (the others — `timeout` and libpq's TLS parameters — are the shared connection's, and
//! the rest go to the driver).

use crate::error::{Error, Result};

/// The default schema.
pub(super) const DEFAULT_SCHEMA: &str = "public";
/// The default table.
pub(super) const DEFAULT_TABLE: &str = "leasehold_leases";
/// The longest schema or table name (the notification channel `schema.table` must stay within
/// PostgreSQL's 63-byte identifiers).
const MAX_NAME: usize = 30;

/// The store's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Options {
    pub(super) schema: String,
    pub(super) table: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            schema: DEFAULT_SCHEMA.into(),
            table: DEFAULT_TABLE.into(),
        }
    }
}

impl Options {
    /// Takes `pair` (`name=value` of the URL's query) when it is one of the store's parameters.
    pub(super) fn take(&mut self, pair: &str, shown: &str) -> Result<bool> {
        let bad = |reason: String| Error::InvalidUrl {
            url: shown.to_owned(),
            reason,
        };
        let Some((name, value)) = pair.split_once('=') else {
            return Ok(false);
        };
        match name {
            "schema" | "table" => {
                if !identifier(value) {
                    return Err(bad(format!(
                        "{name} {value:?}: expected 1 to {MAX_NAME} lower-case letters, digits or \
                         underscores, not starting with a digit"
                    )));
                }
                match name {
                    "schema" => self.schema = value.to_owned(),
                    _ => self.table = value.to_owned(),
                }
            }
            "mode" => match value {
                "table" => {}
                "advisory" => {
                    return Err(bad(
                        "mode \"advisory\" is no longer offered: a session that ended (a restart, \
                         a cut connection, a timeout) freed its advisory lock while its holder \
                         still acted, so two holders could act at once; leave mode out (a dead \
                         holder's lease goes at its TTL)"
                            .into(),
                    ))
                }
                other => return Err(bad(format!("mode {other:?}: expected table (the default)"))),
            },
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The channel releases are notified on: `schema.table`.
    pub(super) fn channel(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
}

/// A name written into SQL text as it is: lower-case ASCII letters, digits and `_`, not starting
/// with a digit, at most [`MAX_NAME`] bytes.
fn identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let mut o = Options::default();
        assert!(o.take("schema=locks", "u").unwrap_or(false));
        assert!(o.take("table=my_leases2", "u").unwrap_or(false));
        assert!(o.take("mode=table", "u").unwrap_or(false));
        assert_eq!(
            (o.schema.as_str(), o.table.as_str()),
            ("locks", "my_leases2")
        );
        assert_eq!(o.channel(), "locks.my_leases2");
        for bad in [
            "table=",
            "table=Leases",
            "table=a\"b",
            "table=1x",
            "schema=a;drop",
            "mode=x",
            "mode=advisory",
        ] {
            assert!(
                matches!(o.take(bad, "u"), Err(Error::InvalidUrl { .. })),
                "{bad}"
            );
        }
        assert!(!o.take("timeout=1s", "u").unwrap_or(true));
        assert!(o.take(&format!("table={}", "x".repeat(31)), "u").is_err());
    }
}
