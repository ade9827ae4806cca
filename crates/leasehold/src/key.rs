//! Keys and their per-store names.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::fmt;

/// A validated lock key.
///
/// ```
/// use leasehold::Key;
/// assert!(Key::new("user:alice").is_ok());
/// assert!(Key::new("").is_err());
/// assert!(Key::new("a\0b").is_err());
/// assert!(Key::from_bytes(b"\xff").is_err());
/// ```
///
/// A [`Key`] is what the user locks: any UTF-8 string of 1 to [`Key::MAX_LEN`] bytes without NUL or
/// other control characters (`user:alice`, `tasks/42`, even `../x`). Stores have narrower alphabets
/// (file names, Kubernetes object names); [`Naming`] maps a key to a store name so that two different
/// keys never share a name: a key that already fits the alphabet is used as it is, any other key becomes
/// a readable part plus `--` and a SHA-256 hash of the whole key. A key that merely *looks* hashed is
/// hashed too, so a plain name and a hashed name never coincide.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// The longest key accepted, in bytes.
    ///
    /// ```
    /// use leasehold::Key;
    /// assert!(Key::new("x".repeat(Key::MAX_LEN)).is_ok());
    /// assert!(Key::new("x".repeat(Key::MAX_LEN + 1)).is_err());
    /// assert!(Key::new("é".repeat(Key::MAX_LEN / 2 + 1)).is_err(), "bytes, not characters");
    /// ```
    pub const MAX_LEN: usize = 1024;

    /// Validates `key`. Anything else is accepted as it is, slashes and dots included: each store
    /// maps keys to safe names of its own ([`Naming`]).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is empty, longer than [`Key::MAX_LEN`] bytes, or contains
    /// NUL or another control character. The error shows the key escaped and cut to 80
    /// characters, with the reason.
    ///
    /// ```
    /// use leasehold::{Error, Key};
    /// assert_eq!(Key::new("../x")?.as_str(), "../x"); // a valid key; no store uses it as a path
    /// for (hostile, why) in [
    ///     ("", "empty"),
    ///     ("a\0b", "NUL"),
    ///     ("line\nbreak", "control character"),
    ///     (&"x".repeat(10 * 1024), "at most 1024"),
    /// ] {
    ///     let err = Key::new(hostile).unwrap_err();
    ///     assert!(matches!(err, Error::InvalidKey { .. }));
    ///     assert!(err.to_string().contains(why) && err.to_string().len() < 200, "{err}");
    /// }
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn new(key: impl AsRef<str>) -> Result<Self> {
        let key = key.as_ref();
        let bad = |reason: &str| Error::InvalidKey {
            key: display_key(key),
            reason: reason.into(),
        };
        if key.is_empty() {
            return Err(bad("empty"));
        }
        if key.len() > Self::MAX_LEN {
            return Err(bad(&format!(
                "{} bytes, at most {} allowed",
                key.len(),
                Self::MAX_LEN
            )));
        }
        if key.contains('\0') {
            return Err(bad("contains NUL"));
        }
        if key.chars().any(char::is_control) {
            return Err(bad("contains a control character"));
        }
        if key.starts_with(Self::RESERVED_PREFIX) {
            return Err(bad(&format!(
                "keys starting with {:?} are the library's own records",
                Self::RESERVED_PREFIX
            )));
        }
        Ok(Key(key.to_owned()))
    }

    /// Keys starting with this are refused by [`Key::new`]: the library keeps records of its own
    /// under them (the fence high-water mark, `cleanup`'s scratch records).
    ///
    /// ```
    /// use leasehold::Key;
    /// let err = Key::new(".leasehold-fences").unwrap_err();
    /// assert!(err.to_string().contains("the library's own"), "{err}");
    /// assert!(Key::new(".leasehold").is_ok() && Key::new("x.leasehold-fences").is_ok());
    /// ```
    pub const RESERVED_PREFIX: &'static str = ".leasehold-";

    /// A key of the library's own records (under [`Key::RESERVED_PREFIX`]), or any valid key:
    /// what a listing of a store's records may hold.
    pub(crate) fn internal(key: impl AsRef<str>) -> Result<Self> {
        let key = key.as_ref();
        match key.strip_prefix(Self::RESERVED_PREFIX) {
            Some(rest) => Self::new(rest).map(|_| Key(key.to_owned())),
            None => Self::new(key),
        }
    }

    /// Validates raw bytes (they must be UTF-8).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for non-UTF-8 bytes and everything [`Key::new`] refuses.
    ///
    /// ```
    /// use leasehold::Key;
    /// assert_eq!(Key::from_bytes("tâche/7".as_bytes())?.as_str(), "tâche/7");
    /// let err = Key::from_bytes(b"ab\xffcd").unwrap_err();
    /// assert!(err.to_string().contains("not valid UTF-8"), "{err}");
    /// assert!(Key::from_bytes(b"").is_err());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        match std::str::from_utf8(bytes) {
            Ok(s) => Self::new(s),
            Err(_) => Err(Error::InvalidKey {
                key: display_key(&String::from_utf8_lossy(bytes)),
                reason: "not valid UTF-8".into(),
            }),
        }
    }

    /// Validates an OS string (a command-line argument); it must be UTF-8.
    ///
    /// # Errors
    /// As [`Key::from_bytes`].
    ///
    /// ```
    /// use leasehold::Key;
    /// use std::ffi::OsStr;
    /// use std::os::unix::ffi::OsStrExt;
    /// assert_eq!(Key::from_os_str(OsStr::new("user:alice"))?.as_str(), "user:alice");
    /// assert!(Key::from_os_str(OsStr::from_bytes(b"\xff")).is_err());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn from_os_str(s: &OsStr) -> Result<Self> {
        match s.to_str() {
            Some(s) => Self::new(s),
            None => Err(Error::InvalidKey {
                key: display_key(&s.to_string_lossy()),
                reason: "not valid UTF-8".into(),
            }),
        }
    }

    /// The key as a string, exactly as given (also what `Display` shows).
    ///
    /// ```
    /// let key = leasehold::Key::new("user:alice")?;
    /// assert_eq!(key.as_str(), "user:alice");
    /// assert_eq!(key.to_string(), "user:alice");
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for Key {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        Key::new(s)
    }
}

impl TryFrom<String> for Key {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Key::new(s)
    }
}

/// Escapes a key for an error message and cuts it to 80 characters.
pub(crate) fn display_key(key: &str) -> String {
    let escaped: String = key.escape_debug().collect();
    if escaped.chars().count() > 80 {
        let cut: String = escaped.chars().take(77).collect();
        format!("\"{cut}...\" ({} bytes)", key.len())
    } else {
        format!("\"{escaped}\"")
    }
}

/// How a store turns keys into names: an alphabet, a length limit and a prefix.
///
/// ```
/// use leasehold::{Key, Naming};
/// let n = Naming::dns1123("task-llm-");
/// assert_eq!(n.name(&Key::new("task-7").unwrap()), "task-llm-task-7");
/// let hashed = n.name(&Key::new("Task/7").unwrap());
/// assert!(hashed.starts_with("task-llm-task-7--") && hashed.len() <= 63);
/// ```
#[derive(Debug, Clone)]
pub struct Naming {
    prefix: String,
    max_len: usize,
    hash_hex: usize,
    replacement: char,
    dns: bool,
}

impl Naming {
    /// File names: `[A-Za-z0-9_.-]`, not starting with `.`, at most 200 bytes (plus the store's
    /// extension), 32 hex digits (128 bits) of hash when hashing.
    ///
    /// ```
    /// use leasehold::{Key, Naming};
    /// let n = Naming::file();
    /// assert_eq!(n.name(&Key::new("user-alice_1.x")?), "user-alice_1.x"); // fits: as it is
    /// let escaped = n.name(&Key::new("../x")?);
    /// assert!(escaped.starts_with("x--") && escaped.len() == 3 + 32, "{escaped}");
    /// assert_ne!(n.name(&Key::new("a/b")?), n.name(&Key::new("a_b")?));
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn file() -> Self {
        Naming {
            prefix: String::new(),
            max_len: 200,
            hash_hex: 32,
            replacement: '_',
            dns: false,
        }
    }

    /// DNS-1123 names as Kubernetes wants them: `[a-z0-9-]`, starting and ending alphanumeric, at
    /// most 63 characters including `prefix`, 16 hex digits (64 bits) of hash when hashing.
    pub fn dns1123(prefix: impl Into<String>) -> Self {
        Naming {
            prefix: prefix.into(),
            max_len: 63,
            hash_hex: 16,
            replacement: '-',
            dns: true,
        }
    }

    fn allowed(&self, c: char) -> bool {
        if self.dns {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
        } else {
            c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-'
        }
    }

    fn looks_hashed(&self, s: &str) -> bool {
        let n = self.hash_hex + 2;
        s.len() >= n && {
            let tail = &s[s.len() - n..];
            tail.starts_with("--")
                && tail[2..]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }
    }

    /// The store name of `key`; two different keys never get the same name (hashed names carry
    /// 64 or 128 bits of SHA-256). The same key always gets the same name.
    ///
    /// ```
    /// use leasehold::{Key, Naming};
    /// let n = Naming::file();
    /// let hashed = n.name(&Key::new("a/b")?);
    /// assert_eq!(n.name(&Key::new("a/b")?), hashed);
    /// // A key that merely looks hashed is hashed too: it cannot take another key's name.
    /// assert_ne!(n.name(&Key::new(hashed.as_str())?), hashed);
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn name(&self, key: &Key) -> String {
        let k = key.as_str();
        let fits = self.prefix.len() + k.len() <= self.max_len
            && k.chars().all(|c| self.allowed(c))
            && !k.starts_with('.')
            && !(self.dns && (self.prefix.is_empty() && k.starts_with('-') || k.ends_with('-')))
            && !self.looks_hashed(k);
        if fits {
            return format!("{}{}", self.prefix, k);
        }
        let digest = Sha256::digest(k.as_bytes());
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hash = String::with_capacity(digest.len() * 2);
        for b in digest.iter() {
            hash.push(HEX[(b >> 4) as usize] as char);
            hash.push(HEX[(b & 15) as usize] as char);
        }
        hash.truncate(self.hash_hex);
        let room = self
            .max_len
            .saturating_sub(self.prefix.len() + 2 + self.hash_hex);
        let mut readable: String = k
            .chars()
            .map(|c| {
                let c = if self.dns { c.to_ascii_lowercase() } else { c };
                if self.allowed(c) {
                    c
                } else {
                    self.replacement
                }
            })
            .collect();
        readable = readable.trim_start_matches(['.', '-', '_']).to_owned();
        readable.truncate(room);
        let readable = readable.trim_end_matches(['-', '.']);
        if readable.is_empty() && self.prefix.is_empty() {
            format!("k--{hash}")
        } else {
            format!("{}{}--{}", self.prefix, readable, hash)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Key {
        Key::new(s).unwrap()
    }

    #[test]
    fn hostile_keys_are_refused_with_a_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("a\0b", "NUL"),
            ("a\nb", "control"),
            (&"x".repeat(10 * 1024), "bytes"),
        ] {
            let e = Key::new(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            assert!(e.len() < 300, "error message stays short: {e}");
        }
        assert!(Key::from_bytes(b"ab\xffcd")
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
        assert!(
            Key::new("../x").is_ok(),
            "a slashy key is a valid key; stores name it safely"
        );
    }

    #[test]
    fn file_names_are_safe_and_distinct() {
        let n = Naming::file();
        assert_eq!(n.name(&k("user-alice_1.x")), "user-alice_1.x");
        let names: Vec<String> = [
            "../x",
            "..",
            ".",
            "/",
            "a/b",
            "a_b",
            "a:b",
            "A",
            "a",
            "é",
            &"y".repeat(1024),
        ]
        .iter()
        .map(|s| n.name(&k(s)))
        .collect();
        for name in &names {
            assert!(
                !name.contains('/') && !name.starts_with('.') && name.len() <= 200,
                "{name}"
            );
        }
        let set: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(set.len(), names.len());
        // A key that looks like a hashed name is hashed again, so it cannot collide.
        let hashed = n.name(&k("a/b"));
        assert_ne!(n.name(&k(&hashed)), hashed);
    }

    #[test]
    fn dns_names_fit_kubernetes() {
        let n = Naming::dns1123("task-llm-");
        for s in ["Task/7", "-x", "x-", &"long".repeat(100), "ÄÖ", "a.b"] {
            let name = n.name(&k(s));
            assert!(name.len() <= 63, "{name}");
            assert!(name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            assert!(
                name.chars().last().unwrap().is_ascii_alphanumeric(),
                "{name}"
            );
        }
        assert_ne!(n.name(&k("A")), n.name(&k("a")));
    }
}
