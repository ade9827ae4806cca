//! A TCP forwarder with a target that can be moved, standing in for what a client reaches a
//! server through in production — a DNS name, a load balancer, a managed service's endpoint.
//!
//! Moving the target affects new connections only: connections already made keep forwarding to
//! the old target, as they do when a DNS name is repointed during a failover. Bytes pass through
//! unchanged; the proxy knows nothing of the protocol.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Whether forwarding is paused, and a wake-up for when it resumes.
type Gate = Arc<(Mutex<bool>, Condvar)>;

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
        let gate: Gate = Arc::new((Mutex::new(false), Condvar::new()));
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
                pump(&client, &server, pumps.clone());
                pump(&server, &client, pumps.clone());
            }
        });
        TcpProxy {
            port,
            target,
            stop,
            gate,
        }
    }

    /// Holds every byte in both directions, on every connection, until [`resume`](Self::resume):
    /// the server unreachable from this proxy's clients only (a partition, a hung load
    /// balancer). Connections stay open; nothing is lost.
    pub fn pause(&self) {
        if let Ok(mut paused) = self.gate.0.lock() {
            *paused = true;
        }
    }

    /// Forwards again, the bytes held first.
    pub fn resume(&self) {
        if let Ok(mut paused) = self.gate.0.lock() {
            *paused = false;
        }
        self.gate.1.notify_all();
    }

    /// Sends new connections to `127.0.0.1:target` from now on.
    pub fn point_to(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` on a thread of its own until `from` ends, then ends `to`'s writing side;
/// what it reads while `gate` is closed it holds until the gate opens.
fn pump(from: &TcpStream, to: &TcpStream, gate: Gate) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let (paused, resumed) = &*gate;
                    let Ok(held) = paused.lock() else { break };
                    match resumed.wait_while(held, |p| *p) {
                        Ok(open) => drop(open),
                        Err(_) => break,
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
        let _ = from.shutdown(Shutdown::Read);
    });
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
