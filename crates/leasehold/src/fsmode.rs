//! File modes of what leasehold creates on disk (the file store's records, the SQLite queue).

use crate::error::{Error, Result};

/// The default mode of created files: the owner reads and writes, nobody else.
pub(crate) const DEFAULT: u32 = 0o600;

/// Checks a file mode given by the user (`?mode=0640`) and returns the mode of the directories
/// created for such files: 0700 plus group/other search and read bits where the files grant read.
///
/// # Errors
/// [`Error::InvalidOption`] for a mode without owner read/write, or above 0777.
pub(crate) fn dir_mode_for(mode: u32) -> Result<u32> {
    if mode & 0o600 != 0o600 || mode > 0o777 {
        return Err(Error::option(
            "mode",
            format!("{mode:o}: must be ≤ 0777 and include 0600"),
        ));
    }
    Ok(0o700 | ((mode & 0o044) >> 2) | (mode & 0o044))
}

/// Parses an octal mode from a URL parameter and checks it as [`dir_mode_for`] does.
#[cfg(feature = "queue")]
pub(crate) fn parse(value: &str) -> std::result::Result<u32, String> {
    let mode = u32::from_str_radix(value, 8).map_err(|_| format!("mode {value:?} is not octal"))?;
    dir_mode_for(mode).map_err(|e| e.to_string())?;
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_get_search_where_files_get_read() {
        assert_eq!(dir_mode_for(0o600).ok(), Some(0o700));
        assert_eq!(dir_mode_for(0o640).ok(), Some(0o750));
        assert_eq!(dir_mode_for(0o644).ok(), Some(0o755));
        assert_eq!(dir_mode_for(0o660).ok(), Some(0o750));
        assert!(dir_mode_for(0o400).is_err() && dir_mode_for(0o1600).is_err());
        #[cfg(feature = "queue")]
        {
            assert_eq!(parse("0640"), Ok(0o640));
            assert!(parse("rw").is_err() && parse("0200").is_err());
        }
    }
}
