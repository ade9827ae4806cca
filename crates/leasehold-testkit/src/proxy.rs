//! The fault-injecting TCP proxy of [`leasehold_servers::TcpProxy`], standing in for what a
//! client reaches a server through in production — a DNS name, a load balancer, a managed
//! service's endpoint: its target can be moved, and it can hold bytes both ways (a partition) or
//! the server's answers only (answers lost in a leader change), delivering what it held on resume.
//!
//! Here it panics when it cannot start, and can be switched from another process
//! ([`TcpProxy::serve_control`]).

use crate::servers::{ok, wrapper};
use leasehold_servers as launch;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;

wrapper!(
    /// A forwarder listening on a free loopback port ([`launch::TcpProxy`]); dropped, it stops
    /// and its connections end.
    TcpProxy = launch::TcpProxy
);

impl TcpProxy {
    /// Starts forwarding connections to `127.0.0.1:target`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(target: u16) -> Self {
        Self(ok(launch::TcpProxy::start(target)))
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
                    for line in BufReader::new(conn).lines() {
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
