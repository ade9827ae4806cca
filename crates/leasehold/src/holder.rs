//! Who holds a lease.

use std::fmt;
use std::sync::OnceLock;

/// The identity written into every lease this process takes, shown to operators and to contenders.
///
/// [`HolderId::from_env`] uses `POD_NAMESPACE/POD_NAME` when Kubernetes' downward API sets them,
/// else `host-pid-random`. Two acquisitions by one holder are still told apart by their owner token
/// (see [`crate::LeaseRecord::token`]): re-acquiring a held key from the same holder is refused, never
/// silently granted twice.
///
/// ```
/// let h = leasehold::HolderId::new("worker-1");
/// assert_eq!(h.as_str(), "worker-1");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderId(String);

impl HolderId {
    /// A holder id chosen by the caller.
    pub fn new(id: impl Into<String>) -> Self {
        HolderId(id.into())
    }

    /// `POD_NAMESPACE/POD_NAME` (or `POD_NAME`) when set and not empty, else
    /// `hostname-pid-xxxxxx` (six random lowercase letters and digits, drawn anew by each call).
    ///
    /// ```
    /// use leasehold::{hostname, HolderId};
    /// std::env::remove_var("POD_NAME");
    /// let id = HolderId::from_env();
    /// assert!(id.as_str().starts_with(&format!("{}-{}-", hostname(), std::process::id())));
    /// std::env::set_var("POD_NAME", "web-0");
    /// std::env::set_var("POD_NAMESPACE", "shop");
    /// assert_eq!(HolderId::from_env().as_str(), "shop/web-0");
    /// ```
    pub fn from_env() -> Self {
        let pod = std::env::var("POD_NAME").ok().filter(|s| !s.is_empty());
        let ns = std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|s| !s.is_empty());
        match (pod, ns) {
            (Some(pod), Some(ns)) => HolderId(format!("{ns}/{pod}")),
            (Some(pod), None) => HolderId(pod),
            _ => HolderId(format!(
                "{}-{}-{}",
                hostname(),
                std::process::id(),
                random_suffix(6)
            )),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for HolderId {
    fn default() -> Self {
        Self::from_env()
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({:?})", self.0)
    }
}

/// This machine's host name (or `"localhost"` when it cannot be read or is not UTF-8).
///
/// ```
/// assert!(!leasehold::hostname().is_empty());
/// ```
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname NUL-terminates or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(s) if !s.is_empty() => s.to_owned(),
        _ => "localhost".into(),
    }
}

pub(crate) fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}

/// A fresh owner token: 128 random bits as 32 hex digits.
pub(crate) fn new_token() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Formatting machinery costs more than the random bits; taken once per acquisition.
    let bits = fastrand::u128(..);
    (0..32)
        .map(|i| HEX[((bits >> (124 - 4 * i)) & 0xf) as usize] as char)
        .collect()
}

/// This process's id, read once (a syscall saved per grant).
pub(crate) fn pid() -> u32 {
    static PID: OnceLock<u32> = OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// This host's name, read once.
pub(crate) fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(hostname)
}
