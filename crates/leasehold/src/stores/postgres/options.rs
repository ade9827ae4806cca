//! The PostgreSQL store's options ([`PostgresOptions`]) and what its URL says: the lock store's
//! own parameters `schema` and `table`, and `mode`, whose only value is `table` (the others —
//! `timeout` and libpq's TLS parameters — are the shared connection's, and the rest go to the
//! driver).

use crate::error::{Error, Result};
use crate::pg::conn::Target;
use crate::url::Params;

/// The default schema.
pub(super) const DEFAULT_SCHEMA: &str = "public";
/// The default table.
pub(super) const DEFAULT_TABLE: &str = "leasehold_leases";
/// The longest schema or table name (the notification channel `schema.table` must stay within
/// PostgreSQL's 63-byte identifiers).
const MAX_NAME: usize = 30;

/// Options of the PostgreSQL store: the server's URL and where the leases live. `Debug` never
/// shows the password.
///
/// ```
/// use leasehold::stores::postgres::PostgresOptions;
/// let o = PostgresOptions::from_url("postgres://locker:s3cret@db:5432/app?table=leases&timeout=5s")?;
/// assert_eq!((o.schema.as_str(), o.table.as_str()), ("public", "leases"));
/// assert_eq!(o.url, "postgres://locker:s3cret@db:5432/app?timeout=5s");
/// assert!(!format!("{o:?}").contains("s3cret"));
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The server's URL, as the driver and the connection read it:
    /// `postgres://user[:password]@host:port/db`, with `?timeout=` (the bound of every call and
    /// of connecting, default 10 s), libpq's TLS parameters (`sslmode`, `sslrootcert`, `sslcert`,
    /// `sslkey`) and the driver's own (`connect_timeout`, `application_name` …).
    pub url: String,
    /// The schema of the lease table (default `public`, `?schema=`): 1 to 30 lower-case letters,
    /// digits or underscores, not starting with a digit.
    pub schema: String,
    /// The lease table (default `leasehold_leases`, `?table=`), named as [`Self::schema`] is.
    pub table: String,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &crate::url::redact(&self.url))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .finish()
    }
}

impl PostgresOptions {
    /// Options for the server at `url`, the lease table at its default place.
    ///
    /// ```
    /// let o = leasehold::stores::postgres::PostgresOptions::new("postgres://locker@db/app");
    /// assert_eq!(o.table, "leasehold_leases");
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            schema: DEFAULT_SCHEMA.into(),
            table: DEFAULT_TABLE.into(),
        }
    }

    /// The options a `postgres://` or `postgresql://` URL gives: `schema` and `table` are taken
    /// out of it, the rest stays in [`Self::url`], checked as connecting would read it.
    ///
    /// ```
    /// use leasehold::stores::postgres::PostgresOptions;
    /// let o = PostgresOptions::from_url("postgresql://locker@db/app?schema=locks&sslmode=require")?;
    /// assert_eq!((o.schema.as_str(), o.url.as_str()), ("locks", "postgresql://locker@db/app?sslmode=require"));
    /// assert!(PostgresOptions::from_url("postgres://locker@db/app?table=Leases").is_err());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a bad schema, table, mode, timeout or TLS parameter, or a URL
    /// the driver refuses.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut params = Params::of_url(url);
        let mut o = PostgresOptions::new(String::new());
        for (name, field) in [("schema", &mut o.schema), ("table", &mut o.table)] {
            if let Some(value) = params.take_str(name) {
                if !identifier(&value) {
                    return Err(params.invalid(format!("{name} {value:?}: {NAME_RULE}")));
                }
                *field = value;
            }
        }
        match params.take_str("mode").as_deref() {
            None | Some("table") => {}
            Some("advisory") => {
                return Err(params.invalid(
                    "mode \"advisory\" is no longer offered: a session that ended (a restart, \
                     a cut connection, a timeout) freed its advisory lock while its holder \
                     still acted, so two holders could act at once; leave mode out (a dead \
                     holder's lease goes at its TTL)",
                ))
            }
            Some(other) => {
                return Err(params.invalid(format!("mode {other:?}: expected table (the default)")))
            }
        }
        let base = url.split_once('?').map_or(url, |(b, _)| b);
        o.url = match params.rest() {
            Some(rest) => format!("{base}?{rest}"),
            None => base.to_owned(),
        };
        // The rest as connecting reads it, refused now rather than then.
        Target::from_params(&o.url, params)?;
        Ok(o)
    }

    /// The connection's target, the schema and table checked.
    pub(crate) fn target(&self) -> Result<Target> {
        for (name, value) in [("schema", &self.schema), ("table", &self.table)] {
            if !identifier(value) {
                return Err(Error::option(name, format!("{value:?}: {NAME_RULE}")));
            }
        }
        Target::parse(&self.url)
    }

    /// The channel releases are notified on: `schema.table`.
    pub(super) fn channel(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
}

/// What [`identifier`] takes, for errors.
const NAME_RULE: &str =
    "expected 1 to 30 lower-case letters, digits or underscores, not starting with a digit";

/// A name written into SQL text as it is: lower-case ASCII letters, digits and `_`, not starting
/// with a digit, at most [`MAX_NAME`] bytes.
fn identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl crate::store::StoreOptions for PostgresOptions {
    fn from_url(url: &str) -> Result<Self> {
        PostgresOptions::from_url(url)
    }

    async fn connect(self) -> Result<std::sync::Arc<dyn crate::store::LockStore>> {
        Ok(std::sync::Arc::new(
            super::PostgresStore::connect(self).await?,
        ))
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<std::time::Duration>> {
        Ok(vec![self.target()?.timeout])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let o = PostgresOptions::from_url(
            "postgres://u@h/db?schema=locks&table=my_leases2&mode=table&timeout=1s",
        )
        .ok();
        let o = o.as_ref();
        assert_eq!(
            o.map(|o| (o.schema.as_str(), o.table.as_str(), o.url.as_str())),
            Some(("locks", "my_leases2", "postgres://u@h/db?timeout=1s"))
        );
        assert_eq!(o.map(|o| o.channel()).as_deref(), Some("locks.my_leases2"));
        for bad in [
            "table=",
            "table=Leases",
            "table=a\"b",
            "table=1x",
            "schema=a;drop",
            "mode=x",
            "mode=advisory",
            "timeout=soon",
            "sslmode=maybe",
        ] {
            let url = format!("postgres://u@h/db?{bad}");
            assert!(
                matches!(
                    PostgresOptions::from_url(&url),
                    Err(Error::InvalidUrl { .. })
                ),
                "{bad}"
            );
        }
        let long = format!("postgres://u@h/db?table={}", "x".repeat(31));
        assert!(PostgresOptions::from_url(&long).is_err());
        let mut o = PostgresOptions::new("postgres://u@h/db");
        o.table = "Bad".into();
        assert!(matches!(
            o.target(),
            Err(Error::InvalidOption { name: "table", .. })
        ));
    }
}
