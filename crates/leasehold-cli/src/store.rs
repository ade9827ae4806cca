//! Which store to use: `--store`, else `LEASEHOLD_STORE` (clap reads both), else a directory
//! under the user's state directory.

use crate::exit::Failure;
use leasehold::LockStore;
use std::path::PathBuf;
use std::sync::Arc;

/// The default store directory: `<state dir>/leasehold/locks`, where the state directory is
/// `dirs::state_dir()` (`$XDG_STATE_HOME` or `~/.local/state`), else `$HOME/.local/state`, else
/// `/tmp`.
pub(crate) fn default_dir() -> PathBuf {
    let state = dirs::state_dir()
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("state"))
        })
        .unwrap_or_else(std::env::temp_dir);
    state.join("leasehold").join("locks")
}

/// The store URL in effect.
///
/// # Errors
/// A usage error when the default directory cannot be written as a URL (a relative path).
pub(crate) fn url(given: Option<&str>) -> Result<String, Failure> {
    match given.map(str::trim).filter(|s| !s.is_empty()) {
        Some(u) => Ok(u.to_owned()),
        None => {
            let dir = default_dir();
            url::Url::from_directory_path(&dir)
                .map(String::from)
                .map_err(|()| {
                    Failure::usage(format!(
                        "the default store directory {} is not an absolute path; use --store URL",
                        dir.display()
                    ))
                })
        }
    }
}

/// Opens the store.
///
/// # Errors
/// A usage error for a bad URL, an error when the store cannot be opened.
pub(crate) async fn open(given: Option<&str>) -> Result<Arc<dyn LockStore>, Failure> {
    let url = url(given)?;
    tracing::debug!(store = %leasehold::redact_url(&url), "opening store");
    Ok(leasehold::open_store(&url).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_url_wins_and_blank_means_default() {
        assert_eq!(url(Some("memory://")).unwrap(), "memory://");
        let d = url(Some("  ")).unwrap();
        assert!(
            d.starts_with("file:///") && d.ends_with("/leasehold/locks/"),
            "{d}"
        );
    }
}
