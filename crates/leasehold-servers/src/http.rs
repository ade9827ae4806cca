//! A minimal HTTP/1.1 client on loopback, to probe and set up the servers.

use crate::process::connect_loopback;
use std::io::{Read, Write};
use std::time::Duration;

/// Whether something answers `GET path` on `127.0.0.1:port` with a 200 whose body contains `needle`.
pub(crate) fn http_ok(port: u16, path: &str, needle: &str) -> bool {
    http_get(port, path).is_some_and(|(code, body)| code == 200 && body.contains(needle))
}

/// A minimal HTTP/1.1 GET on loopback: (status, body), if the server answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "GET", path, &[], "")
}

/// A minimal HTTP/1.1 request on loopback (`Connection: close`): (status, body), if the server
/// answers within 10 s. `headers` are extra `(name, value)` pairs.
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut s = connect_loopback(port)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Some((code, body))
}

/// Decodes a chunked HTTP body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
