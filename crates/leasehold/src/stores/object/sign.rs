//! Pieces both request signers use: HMAC-SHA256 and SHA-256 (`ring`, already the TLS provider),
//! URI encoding, and request times.

use std::time::SystemTime;

/// HMAC-SHA256 of `data` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&key, data).as_ref().to_vec()
}

/// SHA-256 of `data`, in lower-case hex.
#[cfg_attr(not(feature = "s3"), allow(dead_code))] // S3's signature only
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

/// Lower-case hex.
#[cfg_attr(not(feature = "s3"), allow(dead_code))] // S3's signature only
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Percent-encodes every byte but `A-Z a-z 0-9 - _ . ~` (and `/` when `keep_slash`), as AWS
/// Signature Version 4 and Azure's canonical paths want it.
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A request time: `(YYYYMMDDTHHMMSSZ, RFC 1123)`, e.g. `("20130524T000000Z", "Fri, 24 May
/// 2013 00:00:00 GMT")`.
pub(crate) fn times(t: SystemTime) -> (String, String) {
    let rfc3339 = humantime::format_rfc3339_seconds(t).to_string(); // 2013-05-24T00:00:00Z
    let amz: String = rfc3339.chars().filter(|c| *c != '-' && *c != ':').collect();
    let days = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let field = |a: usize, b: usize| rfc3339.get(a..b).unwrap_or("00");
    let month = field(5, 7).parse::<usize>().unwrap_or(1).clamp(1, 12);
    let http = format!(
        "{}, {} {} {} {} GMT",
        WEEKDAYS[(days % 7) as usize],
        field(8, 10),
        MONTHS[month - 1],
        field(0, 4),
        field(11, 19)
    );
    (amz, http)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_in_both_forms() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600); // 2013-05-24
        let (amz, http) = times(t);
        assert_eq!(amz, "20130524T000000Z");
        assert_eq!(http, "Fri, 24 May 2013 00:00:00 GMT");
        let (_, http) = times(SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000 + 3_723));
        assert_eq!(http, "Wed, 18 Nov 2026 12:08:43 GMT");
    }

    #[test]
    fn uri_encoding_keeps_only_unreserved_bytes() {
        assert_eq!(uri_encode("a b/c~d+é", true), "a%20b/c~d%2B%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }
}
