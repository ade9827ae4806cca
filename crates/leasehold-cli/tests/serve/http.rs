//! A small blocking HTTP/1.1 client over `std::net::TcpStream`: requests to `leasehold serve`
//! and to chromedriver, and a reader of server-sent events.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An answer: status, header block (lower-cased names), body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: String,
    pub(crate) body: String,
}

impl Answer {
    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

fn head(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    req
}

/// Sends a request and reads the whole answer.
pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = connect(port);
    s.write_all(head(port, method, path, headers, body).as_bytes())
        .unwrap();
    // Read up to the end of the header block, then the body by its length (chromedriver keeps
    // the connection open), its chunks, or up to the end of the stream.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    let at = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the connection closed before the headers: {raw:?}");
        raw.extend_from_slice(&buf[..n]);
    };
    let headers = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
    let status = headers
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {headers:?}"));
    let length: Option<usize> = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok());
    let mut body = raw[at..].to_vec();
    let body = if headers.contains("transfer-encoding: chunked") {
        let mut d = Dechunk::default();
        d.push(&body);
        while !d.done {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the connection closed inside a chunked body");
            d.push(&buf[..n]);
        }
        d.out
    } else if let Some(len) = length {
        while body.len() < len {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the connection closed inside the body");
            body.extend_from_slice(&buf[..n]);
        }
        body
    } else {
        s.read_to_end(&mut body).unwrap();
        body
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    Answer {
        status,
        headers,
        body,
    }
}

/// `GET path`.
pub(crate) fn get(port: u16, path: &str) -> Answer {
    request(port, "GET", path, &[], "")
}

/// A decoder of a chunked body that arrives in pieces.
#[derive(Default)]
struct Dechunk {
    buf: Vec<u8>,
    out: Vec<u8>,
    /// Whether the last (empty) chunk came.
    done: bool,
}

impl Dechunk {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        loop {
            let Some(eol) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let line = String::from_utf8_lossy(&self.buf[..eol]).into_owned();
            let Ok(size) = usize::from_str_radix(line.trim(), 16) else {
                panic!("bad chunk size {line:?}")
            };
            if self.buf.len() < eol + 2 + size + 2 {
                return;
            }
            if size == 0 {
                self.done = true;
            }
            self.out
                .extend_from_slice(&self.buf[eol + 2..eol + 2 + size]);
            self.buf.drain(..eol + 2 + size + 2);
        }
    }
}

/// A stream of server-sent events, read by a thread of its own.
pub(crate) struct Events {
    rx: mpsc::Receiver<Vec<u8>>,
    dechunk: Dechunk,
    text: String,
}

impl Events {
    /// Opens `GET path` as an event stream.
    pub(crate) fn open(port: u16, path: &str) -> Events {
        let mut s = connect(port);
        s.write_all(head(port, "GET", path, &[("Accept", "text/event-stream")], "").as_bytes())
            .unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        let mut events = Events {
            rx,
            dechunk: Dechunk::default(),
            text: String::new(),
        };
        // The header block, then chunks.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let left = deadline.saturating_duration_since(Instant::now());
            head.extend(
                events
                    .rx
                    .recv_timeout(left)
                    .expect("the event stream's headers"),
            );
        }
        let at = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
        let headers = String::from_utf8_lossy(&head[..at]).to_ascii_lowercase();
        assert!(headers.starts_with("http/1.1 200"), "{headers}");
        assert!(
            headers.contains("content-type: text/event-stream"),
            "{headers}"
        );
        events.dechunk.push(&head[at..]);
        events
    }

    /// The data of the next `update` event (as JSON) within `bound`, or `None`.
    pub(crate) fn next_update(&mut self, bound: Duration) -> Option<serde_json::Value> {
        let deadline = Instant::now() + bound;
        loop {
            self.text.push_str(&String::from_utf8_lossy(&std::mem::take(
                &mut self.dechunk.out,
            )));
            while let Some(end) = self.text.find("\n\n") {
                let event: String = self.text.drain(..end + 2).collect();
                if event.lines().any(|l| l == "event: update") {
                    let data: String = event
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .collect::<Vec<_>>()
                        .join("\n");
                    return Some(serde_json::from_str(&data).unwrap());
                }
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.rx.recv_timeout(left) {
                Ok(bytes) => self.dechunk.push(&bytes),
                Err(_) => return None,
            }
        }
    }

    /// Waits for an update whose leases section satisfies `pred`; panics after `bound`.
    pub(crate) fn wait_for(
        &mut self,
        what: &str,
        bound: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + bound;
        let mut last = String::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.next_update(left) {
                Some(u) => {
                    last = u["leases"].as_str().unwrap_or_default().to_owned();
                    if pred(&last) {
                        return last;
                    }
                }
                None => break,
            }
        }
        panic!("no update within {bound:?} where {what}; last leases section:\n{last}")
    }
}
