//! A TCP forwarder with a target that can be moved, standing in for what a client reaches a
//! server through in production — a DNS name, a load balancer, a managed service's endpoint.
//!
//! Moving the target affects new connections only: connections already made keep forwarding to
//! the old target, as they do when a DNS name is repointed during a failover. Bytes pass through
//! unchanged; the proxy knows nothing of the protocol. Forwarding can be held in both directions
//! (a partition) or in the server's direction to the client only (answers lost in a leader change:
//! the server did the work, the client hears nothing); what is held is kept, in the pieces it was
//! read in, and delivered on resume.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What is held, and a wake-up for when it changes.
type Gate = Arc<(Mutex<Held>, Condvar)>;

/// What the proxy holds.
#[derive(Debug, Default)]
struct Held {
    /// Both directions ([`TcpProxy::pause`]).
    all: bool,
    /// The server's bytes to the client ([`TcpProxy::hold_answers`]).
    answers: bool,
    /// Between two pieces held and then delivered ([`TcpProxy::release_answers`]).
    pace: Duration,
}

impl Held {
    fn holds(&self, answers: bool) -> bool {
        self.all || (answers && self.answers)
    }
}

/// A forwarder listening on a free loopback port; stops accepting on drop (connections already
/// forwarded run on until either side closes).
#[derive(Debug)]
pub struct TcpProxy {
    /// The port it listens on.
    pub port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    gate: Gate,
}

impl TcpProxy {
    /// Starts forwarding connections to `127.0.0.1:target`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(target: u16) -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("proxy: bind: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy: local address: {e}"))
            .port();
        let target = Arc::new(AtomicU16::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let gate: Gate = Arc::default();
        let (to, stopped, pumps) = (target.clone(), stop.clone(), gate.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", to.load(Ordering::SeqCst)))
                else {
                    // Nothing listens there: the client sees its connection closed.
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                pump(&client, &server, pumps.clone(), false);
                pump(&server, &client, pumps.clone(), true);
            }
        });
        TcpProxy {
            port,
            target,
            stop,
            gate,
        }
    }

    fn set(&self, f: impl FnOnce(&mut Held)) {
        if let Ok(mut held) = self.gate.0.lock() {
            f(&mut held);
        }
        self.gate.1.notify_all();
    }

    /// Holds every byte in both directions, on every connection, until [`resume`](Self::resume):
    /// the server unreachable from this proxy's clients only (a partition, a hung load
    /// balancer). Connections stay open; nothing is lost.
    pub fn pause(&self) {
        self.set(|h| h.all = true);
    }

    /// Forwards again, the bytes held first.
    pub fn resume(&self) {
        self.set(|h| h.all = false);
    }

    /// Holds what the server sends, on every connection, until
    /// [`release_answers`](Self::release_answers); requests still reach it. The server does
    /// what it is asked and its client hears nothing — an answer lost or late in a leader change.
    pub fn hold_answers(&self) {
        self.set(|h| {
            h.answers = true;
            h.pace = Duration::ZERO;
        });
    }

    /// Forwards what the server sends again: what was held first, in the pieces it was read in,
    /// `pace` apart (so that the client handles one answer before it reads the next).
    pub fn release_answers(&self, pace: Duration) {
        self.set(|h| {
            h.answers = false;
            h.pace = pace;
        });
    }

    /// Sends new connections to `127.0.0.1:target` from now on.
    pub fn point_to(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
    }

    /// Lets another process (a binding's tests) pause and resume this proxy: serves `pause` and
    /// `resume` lines on a free loopback port, which it returns, answering each with `ok` once
    /// done (`unknown` to anything else).
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn serve_control(self: &Arc<Self>) -> u16 {
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("proxy control: bind: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy control: local address: {e}"))
            .port();
        let proxy = Arc::clone(self);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let proxy = Arc::clone(&proxy);
                std::thread::spawn(move || {
                    let Ok(mut out) = conn.try_clone() else {
                        return;
                    };
                    for line in std::io::BufRead::lines(std::io::BufReader::new(conn)) {
                        let Ok(line) = line else { return };
                        let answer = match line.trim() {
                            "pause" => {
                                proxy.pause();
                                "ok"
                            }
                            "resume" => {
                                proxy.resume();
                                "ok"
                            }
                            _ => "unknown",
                        };
                        if writeln!(out, "{answer}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing side: one thread reads (so
/// that what arrives while held keeps its pieces), one writes what `gate` lets through.
/// `answers`: this is the server's direction.
fn pump(from: &TcpStream, to: &TcpStream, gate: Gate, answers: bool) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    // Each piece read, and whether it was read while held.
    let (tx, rx) = mpsc::channel::<(Vec<u8>, bool)>();
    let reading = gate.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let held = reading.0.lock().map(|h| h.holds(answers)).unwrap_or(false);
                    if tx.send((buf[..n].to_vec(), held)).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        for (piece, was_held) in rx {
            let (state, changed) = &*gate;
            let Ok(held) = state.lock() else { break };
            let pace = match changed.wait_while(held, |h| h.holds(answers)) {
                Ok(open) => open.pace,
                Err(_) => break,
            };
            if to.write_all(&piece).is_err() {
                break;
            }
            if was_held && !pace.is_zero() {
                std::thread::sleep(pace);
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
