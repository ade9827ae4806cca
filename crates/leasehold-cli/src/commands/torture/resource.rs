//! The fenced resource of `leasehold torture`: a separate process that clients write to under
//! their leases, one line per request on a Unix socket. Per key it keeps the highest fence it
//! accepted and refuses lower ones, and it judges, as it receives them, whether two clients were
//! ever inside one key's critical section at once.
//!
//! Requests (one line each, answered `ok` or `stale`, or a JSON line for `Q`):
//! * `E KEY FENCE CLIENT VALID` — the client entered its critical section under a new grant;
//! * `W KEY FENCE CLIENT VALID` — a write inside it;
//! * `X KEY FENCE CLIENT VALID` — it left;
//! * `L KEY FENCE CLIENT VALID` — its lease's stop signal fired (the guard said stop) while it
//!   was inside; it leaves next;
//! * `S CLIENT` / `D CLIENT` — from the harness, before it stops / kills that client; `K CLIENT`
//!   after the kill (its section ends with it);
//! * `Q` — the counts since the last `Q`, as JSON (`P`: the same, not reset);
//! * `V` — the clients inside a critical section now (answered `leaving C1 C2 …`) are to leave
//!   it: the next write of each is answered `leave` (refused, not counted);
//! * `I` — the clients inside a critical section now (`inside C1 C2 …`); `F SINCE` — those that
//!   entered one at or after `SINCE` (CLOCK_MONOTONIC ns; `entered C1 C2 …`).
//!
//! `VALID` is the sender's lease's `valid_until` as an absolute CLOCK_MONOTONIC time in
//! nanoseconds, the clock every process of the host reads alike. Two clients inside one key at
//! once are an exclusion violation only while the earlier one's lease was still valid by its own
//! clock when the later one entered: a holder whose lease had run out (paused, starved by a loaded
//! machine, stopped or killed by the harness) is a late holder, which no lock can stop and the
//! fence must catch.
//!
//! On semaphores and read-write locks ([`Mode`]) every section request carries two more fields,
//! `OP KEY FENCE CLIENT VALID ROLE START`: `ROLE` is `p` (a semaphore's permit), `r` or `w` (a
//! read or the write permit), `START` when the client began to ask for it (CLOCK_MONOTONIC ns).
//! Many clients are then inside a key at once, each with its own fence, and the resource judges:
//! * an **overlap** when a client enters while others its permit excludes (on a semaphore of N:
//!   N others; a writer: anyone; a reader: a writer), neither stopped nor killed and with valid
//!   leases, are inside; a **paused overlap** when that holds only counting the late ones;
//! * a **fence violation** when a client (not late) enters with a fence that another client
//!   entered with, or that is not above every fence entered before its `START` (those grants
//!   came before its own, so the store owed it a higher fence), or, on a read-write lock, a
//!   writer's fence not above every fence entered, a reader's not above every writer's;
//! * a request **caught by the fence** on a read-write lock, as a resource fenced per permit
//!   kind refuses it: a writer's below the highest fence it served, a reader's below the highest
//!   writer's (a semaphore's holders write beside each other: no fence orders them).
//!
//! `VALID` may be `-` for a section that lasts as long as its process does (a command under
//! `leasehold run`, which kills it before its lease could expire): such a section is inside until it
//! leaves or its process dies, which the resource sees as its connection closing. Every section ends
//! when its connection closes.

use super::Mode;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What the resource counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Critical sections entered (grants whose fence was accepted).
    pub(crate) sections: u64,
    /// Writes accepted.
    pub(crate) writes: u64,
    /// Two clients inside one key's section at once while the earlier one's lease was still
    /// valid by its own clock, and the harness had neither stopped nor killed it: an exclusion
    /// violation.
    pub(crate) overlaps: u64,
    /// The same with a late earlier holder (its lease run out by its own clock, or stopped or
    /// killed by the harness): what no lock can prevent, and what the fence must catch.
    pub(crate) paused_overlaps: u64,
    /// Requests refused for a fence below the key's highest (or equal to another client's):
    /// stale holders caught by the fence.
    pub(crate) stale_rejected: u64,
    /// A new grant whose fence was not above the key's highest while its lease was valid, from a
    /// client the harness did not stop: fences not strictly increasing per grant.
    pub(crate) fence_violations: u64,
    /// Another client entered after the earlier one's lease had run out by its own clock, while
    /// the earlier one, neither stopped nor killed, was still inside without having said that its
    /// stop signal fired: the signal came late (or its process was starved).
    pub(crate) unsignalled: u64,
}

impl Counts {
    /// As one JSON object.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "sections": self.sections, "writes": self.writes, "overlaps": self.overlaps,
            "paused_overlaps": self.paused_overlaps, "stale_rejected": self.stale_rejected,
            "fence_violations": self.fence_violations, "unsignalled": self.unsignalled,
        })
    }

    /// Read back from [`Counts::json`].
    pub(crate) fn from_json(v: &serde_json::Value) -> Option<Counts> {
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        Some(Counts {
            sections: n("sections")?,
            writes: n("writes")?,
            overlaps: n("overlaps")?,
            paused_overlaps: n("paused_overlaps")?,
            stale_rejected: n("stale_rejected")?,
            fence_violations: n("fence_violations")?,
            unsignalled: n("unsignalled")?,
        })
    }
}

/// A client inside a key's critical section.
#[derive(Debug, Clone)]
struct Inside {
    client: String,
    /// Until when its lease is valid (CLOCK_MONOTONIC ns), as last told; `u64::MAX` while its
    /// process lives.
    valid: u64,
    /// The connection it spoke on: the section ends when it closes.
    conn: u64,
    /// Whether it said its stop signal fired.
    signalled: bool,
    /// The fence it entered with (semaphores and read-write locks).
    fence: u64,
    /// Whether it holds a read-write lock's write permit.
    write: bool,
}

/// The permit a section request is made under, on semaphores and read-write locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// One permit of a semaphore.
    Permit,
    /// A read permit.
    Read,
    /// The write permit.
    Write,
}

impl Role {
    /// Its form in requests: `p`, `r`, `w`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Permit => "p",
            Role::Read => "r",
            Role::Write => "w",
        }
    }

    /// What it enters to do, for messages: ` to read`, ` to write`, or nothing.
    fn doing(self) -> &'static str {
        match self {
            Role::Permit => "",
            Role::Read => " to read",
            Role::Write => " to write",
        }
    }

    /// Read back from [`Role::as_str`].
    pub(crate) fn parse(s: &str) -> Option<Role> {
        match s {
            "p" => Some(Role::Permit),
            "r" => Some(Role::Read),
            "w" => Some(Role::Write),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct KeyState {
    /// Whose grant the key's highest fence is.
    owner: String,
    inside: Option<Inside>,
    /// Semaphores and read-write locks: the clients inside.
    holders: Vec<Inside>,
    /// Semaphores and read-write locks: who entered with each fence.
    granted: HashMap<u64, String>,
    /// Semaphores and read-write locks: when each entry was received (CLOCK_MONOTONIC ns) and
    /// the highest fence entered until then, in the order received.
    entries: Vec<(u64, u64)>,
    /// The highest fence entered, and the highest a writer entered with.
    highest: u64,
    highest_write: u64,
}

impl KeyState {
    /// The highest fence entered before `at` (CLOCK_MONOTONIC ns), 0 if none.
    fn highest_before(&self, at: u64) -> u64 {
        let i = self.entries.partition_point(|(t, _)| *t < at);
        i.checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map_or(0, |(_, f)| *f)
    }
}

#[derive(Debug)]
struct State {
    /// What the keys are.
    mode: Mode,
    /// The highest fence accepted per key: the check a user's resource makes.
    gate: leasehold::fence::FenceGate,
    keys: HashMap<String, KeyState>,
    /// Clients the harness stopped since their last accepted grant.
    late: HashMap<String, bool>,
    /// Clients the harness is killing or killed. Never cleared: a request a dying client sent
    /// before the kill may arrive after the harness's word, and a killed client never comes back
    /// (its replacement has an id of its own).
    dying: std::collections::HashSet<String>,
    /// When each client last entered a critical section (CLOCK_MONOTONIC ns).
    entered: HashMap<String, u64>,
    /// Clients told to leave their critical section: their next write is answered `leave`.
    leaving: std::collections::HashSet<String>,
    counts: Counts,
    /// Where each request and its answer are written.
    history: Option<std::io::BufWriter<std::fs::File>>,
}

impl Default for State {
    fn default() -> Self {
        State::new(Mode::Lock)
    }
}

impl State {
    fn new(mode: Mode) -> State {
        State {
            mode,
            gate: leasehold::fence::FenceGate::default(),
            keys: HashMap::new(),
            late: HashMap::new(),
            dying: std::collections::HashSet::new(),
            entered: HashMap::new(),
            leaving: std::collections::HashSet::new(),
            counts: Counts::default(),
            history: None,
        }
    }

    fn late(&self, client: &str) -> bool {
        self.late.get(client).copied().unwrap_or(false) || self.dying.contains(client)
    }

    /// Ends the sections entered on connection `conn` (it closed: their processes are gone).
    fn closed(&mut self, conn: u64) {
        for k in self.keys.values_mut() {
            if k.inside.as_ref().is_some_and(|i| i.conn == conn) {
                k.inside = None;
            }
            k.holders.retain(|i| i.conn != conn);
        }
    }

    /// Answers one request line received on connection `conn`.
    fn answer(&mut self, line: &str, conn: u64) -> String {
        let parts: Vec<&str> = line.split_whitespace().collect();
        // A client told to leave: its next write is refused; a section it entered or left since
        // is judged as any other.
        if let [op @ ("E" | "W" | "X"), _, _, client, ..] = parts.as_slice() {
            if self.leaving.remove(*client) && *op == "W" {
                return "leave".into();
            }
        }
        match parts.as_slice() {
            ["Q"] => std::mem::take(&mut self.counts).json().to_string(),
            // The counts so far, kept (a progress line).
            ["P"] => self.counts.json().to_string(),
            // The clients inside a critical section now, space-separated.
            ["I"] => {
                let mut inside: Vec<&str> = self
                    .keys
                    .values()
                    .flat_map(|k| k.inside.iter().chain(&k.holders))
                    .map(|i| i.client.as_str())
                    .collect();
                inside.sort_unstable();
                inside.dedup();
                format!("inside {}", inside.join(" ")).trim_end().to_owned()
            }
            // The clients that entered a critical section at or after `since` (CLOCK_MONOTONIC
            // ns), space-separated.
            ["F", since] => {
                let Ok(since) = since.parse::<u64>() else {
                    return "error: bad number".into();
                };
                let mut entered: Vec<&str> = self
                    .entered
                    .iter()
                    .filter(|(_, at)| **at >= since)
                    .map(|(c, _)| c.as_str())
                    .collect();
                entered.sort_unstable();
                format!("entered {}", entered.join(" "))
                    .trim_end()
                    .to_owned()
            }
            // The clients inside now leave: each one's next write is answered `leave`.
            ["V"] => {
                let mut inside: Vec<String> = self
                    .keys
                    .values()
                    .flat_map(|k| k.inside.iter().chain(&k.holders))
                    .map(|i| i.client.clone())
                    .collect();
                inside.sort_unstable();
                inside.dedup();
                let answer = format!("leaving {}", inside.join(" "))
                    .trim_end()
                    .to_owned();
                self.leaving.extend(inside);
                answer
            }
            ["K", client] => {
                for k in self.keys.values_mut() {
                    if k.inside.as_ref().is_some_and(|i| i.client == *client) {
                        k.inside = None;
                    }
                    k.holders.retain(|i| i.client != *client);
                }
                "ok".into()
            }
            ["S", client] => {
                self.late.insert((*client).to_owned(), true);
                "ok".into()
            }
            ["D", client] => {
                self.dying.insert((*client).to_owned());
                "ok".into()
            }
            [op @ ("E" | "W" | "X" | "L"), key, fence, client, valid] => {
                let valid = if *valid == "-" {
                    Ok(u64::MAX)
                } else {
                    valid.parse::<u64>()
                };
                let (Ok(fence), Ok(valid)) = (fence.parse::<u64>(), valid) else {
                    return "error: bad number".into();
                };
                let now = crate::process::group_guard::monotonic_ns();
                self.section(op, key, fence, (client, conn), valid, now)
            }
            [op @ ("E" | "W" | "X" | "L"), key, fence, client, valid, role, start] => {
                let valid = if *valid == "-" {
                    Ok(u64::MAX)
                } else {
                    valid.parse::<u64>()
                };
                let (Ok(fence), Ok(valid), Some(role), Ok(start)) = (
                    fence.parse::<u64>(),
                    valid,
                    Role::parse(role),
                    start.parse::<u64>(),
                ) else {
                    return "error: bad number or role".into();
                };
                let now = crate::process::group_guard::monotonic_ns();
                let held = Held {
                    client,
                    conn,
                    fence,
                    valid,
                    role,
                    start,
                };
                self.permit_section(op, key, &held, now)
            }
            _ => "error: unknown request".into(),
        }
    }

    /// Judges one section request from `client` on connection `conn`, received at `now`
    /// (CLOCK_MONOTONIC ns).
    fn section(
        &mut self,
        op: &str,
        key: &str,
        fence: u64,
        (client, conn): (&str, u64),
        valid: u64,
        now: u64,
    ) -> String {
        let late = self.late(client) || valid <= now;
        let k = self.keys.entry(key.to_owned()).or_default();
        let inside_me = k.inside.as_ref().is_some_and(|i| i.client == client);
        if op == "X" {
            if inside_me {
                k.inside = None;
            }
            return "ok".into();
        }
        if op == "L" {
            if let Some(i) = k.inside.as_mut().filter(|_| inside_me) {
                i.signalled = true;
            }
            return "ok".into();
        }
        let highest = self.gate.highest(key).unwrap_or(0);
        let new_grant = op == "E" || fence > highest;
        // The same fence from another client would be one fence granted twice.
        let reused = fence == highest && k.owner != client;
        if reused || self.gate.check(key, fence).is_err() {
            self.counts.stale_rejected += 1;
            if op == "E" && !late {
                self.counts.fence_violations += 1;
                crate::output::errln!(
                    "leasehold torture: fence violation on {key}: {client} entered with fence {fence}, not above {highest} of {}",
                    k.owner
                );
            }
            return "stale".into();
        }
        if new_grant {
            if let Some(other) = k.inside.clone().filter(|i| i.client != client) {
                if self.late(&other.client) {
                    self.counts.paused_overlaps += 1;
                } else if other.valid <= now {
                    self.counts.paused_overlaps += 1;
                    if !other.signalled {
                        self.counts.unsignalled += 1;
                    }
                } else {
                    self.counts.overlaps += 1;
                    let left = if other.valid == u64::MAX {
                        "its process alive".to_owned()
                    } else {
                        format!("valid {} ms more", (other.valid - now) / 1_000_000)
                    };
                    crate::output::errln!(
                        "leasehold torture: overlap on {key}: {client} entered with fence {fence} while {} (fence {highest}, {left}) was inside",
                        other.client
                    );
                }
            }
            let k = self.keys.entry(key.to_owned()).or_default();
            k.owner = client.to_owned();
            k.inside = Some(Inside {
                client: client.to_owned(),
                valid,
                conn,
                signalled: false,
                fence,
                write: true,
            });
            self.counts.sections += 1;
            self.late.insert(client.to_owned(), false);
            self.entered.insert(client.to_owned(), now);
        } else if let Some(i) = k.inside.as_mut().filter(|_| inside_me) {
            i.valid = valid;
        }
        self.counts.writes += u64::from(op == "W");
        "ok".into()
    }
}

/// A section request under a permit: who sent it on which connection, its permit's fence, role,
/// `valid_until` and when it began to ask for it.
#[derive(Debug, Clone, Copy)]
struct Held<'a> {
    client: &'a str,
    conn: u64,
    fence: u64,
    valid: u64,
    role: Role,
    start: u64,
}

impl State {
    /// Judges one section request under a permit `h` of a semaphore or read-write key, received at
    /// `now` (CLOCK_MONOTONIC ns).
    fn permit_section(&mut self, op: &str, key: &str, h: &Held<'_>, now: u64) -> String {
        let late = self.late(h.client) || h.valid <= now;
        // Split borrows: the key's state, and who is late.
        let (late_map, dying) = (&self.late, &self.dying);
        let is_late = |c: &str| late_map.get(c).copied().unwrap_or(false) || dying.contains(c);
        let k = self.keys.entry(key.to_owned()).or_default();
        let mine = k.holders.iter().position(|i| i.client == h.client);
        match op {
            "X" => {
                if let Some(i) = mine {
                    k.holders.remove(i);
                }
                return "ok".into();
            }
            "L" => {
                if let Some(i) = mine.and_then(|i| k.holders.get_mut(i)) {
                    i.signalled = true;
                }
                return "ok".into();
            }
            _ => {}
        }
        // What a resource fenced per permit kind refuses.
        let reused = k.granted.get(&h.fence).is_some_and(|c| c != h.client);
        let below_gate = match h.role {
            Role::Write => h.fence < k.highest,
            Role::Read => h.fence < k.highest_write,
            Role::Permit => false,
        };
        if op == "W" {
            if reused || below_gate {
                self.counts.stale_rejected += 1;
                return "stale".into();
            }
            if let Some(i) = mine.and_then(|i| k.holders.get_mut(i)) {
                i.valid = h.valid;
            }
            self.counts.writes += 1;
            return "ok".into();
        }
        // An entry: a new grant, whose fence must be above every fence entered before the client
        // asked (and, on a read-write lock, above the fences its permit kind is fenced by).
        let floor = match h.role {
            Role::Write => k.highest,
            Role::Read => k.highest_write,
            Role::Permit => 0,
        }
        .max(k.highest_before(h.start));
        if reused || h.fence <= floor {
            if !late {
                self.counts.stale_rejected += 1;
                self.counts.fence_violations += 1;
                let reuse = if reused {
                    format!(
                        ", which {} entered with",
                        k.granted
                            .get(&h.fence)
                            .map_or("another client", String::as_str)
                    )
                } else {
                    String::new()
                };
                crate::output::errln!(
                    "leasehold torture: fence violation on {key}: {} entered with fence {}{}, not above {floor}{reuse}",
                    h.client,
                    h.fence,
                    h.role.doing(),
                );
                return "stale".into();
            }
            if reused || below_gate {
                self.counts.stale_rejected += 1;
                return "stale".into();
            }
        }
        // How many of those inside its permit excludes it may meet: on a semaphore of N, N-1.
        let (allowed, excludes): (usize, fn(&Inside) -> bool) = match (self.mode, h.role) {
            (Mode::Semaphore(n), _) => (usize::try_from(n).unwrap_or(usize::MAX), |_| true),
            (_, Role::Write) => (1, |_| true),
            (_, _) => (1, |i| i.write),
        };
        let others: Vec<&Inside> = k
            .holders
            .iter()
            .filter(|i| i.client != h.client && excludes(i))
            .collect();
        let valid_others: Vec<&&Inside> = others
            .iter()
            .filter(|i| !is_late(&i.client) && i.valid > now)
            .collect();
        if valid_others.len() >= allowed {
            self.counts.overlaps += 1;
            let names: Vec<String> = valid_others
                .iter()
                .map(|i| {
                    let role = if i.write { " writing" } else { "" };
                    format!("{} (fence {}{role})", i.client, i.fence)
                })
                .collect();
            crate::output::errln!(
                "leasehold torture: overlap on {key}: {} entered with fence {}{} while {} {} inside",
                h.client,
                h.fence,
                h.role.doing(),
                names.join(", "),
                if names.len() == 1 { "was" } else { "were" },
            );
        } else if others.len() >= allowed {
            self.counts.paused_overlaps += 1;
            if others
                .iter()
                .any(|i| !is_late(&i.client) && i.valid <= now && !i.signalled)
            {
                self.counts.unsignalled += 1;
            }
        }
        if let Some(i) = mine {
            k.holders.remove(i);
        }
        k.holders.push(Inside {
            client: h.client.to_owned(),
            valid: h.valid,
            conn: h.conn,
            signalled: false,
            fence: h.fence,
            write: h.role == Role::Write,
        });
        k.granted.insert(h.fence, h.client.to_owned());
        k.highest = k.highest.max(h.fence);
        if h.role == Role::Write {
            k.highest_write = k.highest_write.max(h.fence);
        }
        let highest = k.highest;
        k.entries.push((now, highest));
        self.counts.sections += 1;
        self.late.insert(h.client.to_owned(), false);
        self.entered.insert(h.client.to_owned(), now);
        "ok".into()
    }
}

/// Serves requests on `socket` until killed, writing each request, when it was received
/// (CLOCK_MONOTONIC ns), on which connection, and its answer, to `history` if given.
pub(crate) fn serve(socket: &Path, mode: Mode, history: Option<&Path>) -> std::io::Result<()> {
    let listener = UnixListener::bind(socket)?;
    let history = match history {
        Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p)?)),
        None => None,
    };
    let state = Arc::new(Mutex::new(State {
        history,
        ..State::new(mode)
    }));
    for (conn, stream) in (0u64..).zip(listener.incoming()) {
        let Ok(stream) = stream else { continue };
        let state = state.clone();
        std::thread::spawn(move || {
            connection(stream, &state, conn);
            if let Ok(mut s) = state.lock() {
                s.closed(conn);
            }
        });
    }
    Ok(())
}

fn connection(stream: UnixStream, state: &Mutex<State>, conn: u64) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let answer = match state.lock() {
            Ok(mut s) => {
                let answer = s.answer(&line, conn);
                // A progress read is nothing that happened.
                if let Some(h) = s.history.as_mut().filter(|_| line != "P") {
                    let now = crate::process::group_guard::monotonic_ns();
                    // The history is a record for people; a failed write must not stop the run.
                    let _ = writeln!(h, "{now} c{conn} {line} -> {answer}");
                    if line == "Q" {
                        let _ = h.flush();
                    }
                }
                answer
            }
            Err(_) => return,
        };
        if writeln!(out, "{answer}").is_err() {
            return;
        }
    }
}

/// A connection to the resource.
#[derive(Debug)]
pub(crate) struct Resource {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Resource {
    /// Connects to the resource at `socket`.
    pub(crate) fn connect(socket: &Path) -> std::io::Result<Self> {
        let writer = UnixStream::connect(socket)?;
        let reader = BufReader::new(writer.try_clone()?);
        Ok(Resource { reader, writer })
    }

    /// Sends one request and reads its answer.
    pub(crate) fn ask(&mut self, request: &str) -> std::io::Result<String> {
        writeln!(self.writer, "{request}")?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the resource closed the connection",
            ));
        }
        Ok(answer.trim_end().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_tells_overlaps_late_holders_and_stale_fences_apart() {
        let mut s = State::default();
        // Leases valid until 1000 (ns on the shared clock); requests received at 100 .. 900.
        let at = |s: &mut State, line: &str, now: u64| {
            let p: Vec<&str> = line.split(' ').collect();
            s.section(p[0], p[1], p[2].parse().unwrap(), (p[3], 0), 1000, now)
        };
        assert_eq!(at(&mut s, "E k 5 a", 100), "ok");
        assert_eq!(at(&mut s, "W k 5 a", 110), "ok");
        // b enters while a is inside with a valid lease: an overlap.
        assert_eq!(at(&mut s, "E k 6 b", 120), "ok");
        // a writes on with its old fence: refused.
        assert_eq!(at(&mut s, "W k 5 a", 130), "stale");
        assert_eq!(at(&mut s, "X k 6 b", 140), "ok");
        // c is stopped inside; d enters: a late holder's overlap; c's late write is refused.
        assert_eq!(at(&mut s, "E k 7 c", 150), "ok");
        assert_eq!(s.answer("S c", 9), "ok");
        assert_eq!(at(&mut s, "E k 8 d", 160), "ok");
        assert_eq!(at(&mut s, "W k 7 c", 170), "stale");
        // A new grant below the highest while its lease is valid: fences went backwards.
        assert_eq!(at(&mut s, "E k 3 e", 180), "stale");
        // The same from a holder whose lease had run out by its own clock: late, not a violation.
        assert_eq!(at(&mut s, "E k 4 e", 2000), "stale");
        // A killed client's section ends with it.
        assert_eq!(s.answer("D d", 9), "ok");
        assert_eq!(s.answer("K d", 9), "ok");
        assert_eq!(at(&mut s, "E k 9 f", 190), "ok");
        // f starved past its lease; g enters after it: late, not a violation.
        assert_eq!(at(&mut s, "E k 10 g", 1500), "ok");
        let c = Counts::from_json(&serde_json::from_str(&s.answer("Q", 9)).unwrap()).unwrap();
        assert_eq!(
            c,
            Counts {
                sections: 6,
                writes: 1,
                overlaps: 1,
                paused_overlaps: 2,
                stale_rejected: 4,
                fence_violations: 1,
                unsignalled: 1,
            }
        );
    }

    #[test]
    fn a_grant_a_dying_client_announces_after_the_kill_notice_stays_late() {
        // The harness says a is dying; a's entry, sent before the SIGKILL, arrives after that
        // word; the kernel frees a's lease at its death and b enters: a late holder, not an
        // overlap.
        let mut s = State::default();
        assert_eq!(s.answer("D a", 9), "ok");
        assert_eq!(s.section("E", "k", 5, ("a", 1), 1000, 100), "ok");
        assert_eq!(s.section("E", "k", 6, ("b", 2), 1000, 110), "ok");
        let c = Counts::from_json(&serde_json::from_str(&s.answer("Q", 9)).unwrap()).unwrap();
        assert_eq!((c.overlaps, c.paused_overlaps), (0, 1));
    }

    /// Counts of a state's `Q`.
    fn counts(s: &mut State) -> Counts {
        Counts::from_json(&serde_json::from_str(&s.answer("Q", 9)).unwrap()).unwrap()
    }

    #[test]
    fn a_semaphore_overlaps_only_past_its_permits_and_its_fences_must_rise() {
        let mut s = State::new(Mode::Semaphore(2));
        // `OP KEY FENCE CLIENT VALID ROLE START`, received at 100 .. : leases valid until 1000.
        let at = |s: &mut State, line: &str, conn: u64| s.answer(line, conn);
        assert_eq!(at(&mut s, "E k 5 a - p 1", 1), "ok");
        assert_eq!(at(&mut s, "E k 6 b - p 1", 2), "ok");
        // Both hold a permit: writes of the lower fence are no stale writes on a semaphore.
        assert_eq!(at(&mut s, "W k 5 a - p 1", 1), "ok");
        // A third inside: an overlap.
        assert_eq!(at(&mut s, "E k 7 c - p 1", 3), "ok");
        assert_eq!(at(&mut s, "X k 7 c - p 1", 3), "ok");
        // Entries may arrive out of grant order (d was granted before b entered) …
        assert_eq!(at(&mut s, "X k 6 b - p 1", 2), "ok");
        let now = crate::process::group_guard::monotonic_ns();
        assert_eq!(at(&mut s, &format!("E k 4 d - p {now}"), 4), "stale");
        // … but not below a fence entered before it asked, nor on a fence already entered.
        assert_eq!(at(&mut s, "E k 6 e - p 1", 5), "stale");
        let c = counts(&mut s);
        assert_eq!(
            (c.sections, c.overlaps, c.fence_violations, c.writes),
            (3, 1, 2, 1)
        );
        assert_eq!(
            at(&mut s, "E k 3 f - p 1", 6),
            "ok",
            "granted before anything entered"
        );
    }

    #[test]
    fn a_read_write_lock_overlaps_with_a_writer_beside_anyone() {
        let mut s = State::new(Mode::ReadWrite);
        let at = |s: &mut State, line: &str, conn: u64| s.answer(line, conn);
        assert_eq!(at(&mut s, "E k 5 a - r 1", 1), "ok");
        assert_eq!(at(&mut s, "E k 6 b - r 1", 2), "ok");
        assert_eq!(counts(&mut s).overlaps, 0, "readers share");
        // A writer beside readers, a reader beside a writer: overlaps.
        assert_eq!(at(&mut s, "E k 7 w - w 1", 3), "ok");
        assert_eq!(at(&mut s, "E k 8 c - r 1", 4), "ok");
        assert_eq!(counts(&mut s).overlaps, 2);
        // The fence orders reads and writes: a reader's write below the writer's fence, a
        // writer's below the highest read, are caught.
        assert_eq!(at(&mut s, "W k 5 a - r 1", 1), "stale");
        assert_eq!(at(&mut s, "W k 7 w - w 1", 3), "stale");
        assert_eq!(at(&mut s, "W k 8 c - r 1", 4), "ok");
        // A writer whose fence is not above every fence entered: a violation.
        for (line, conn) in [
            ("X k 5 a - r 1", 1),
            ("X k 6 b - r 1", 2),
            ("X k 7 w - w 1", 3),
        ] {
            assert_eq!(at(&mut s, line, conn), "ok");
        }
        assert_eq!(at(&mut s, "X k 8 c - r 1", 4), "ok");
        assert_eq!(at(&mut s, "E k 8 d - w 1", 5), "stale");
        let c = counts(&mut s);
        assert_eq!((c.stale_rejected, c.fence_violations), (3, 1));
        // A stopped writer's section: a reader beside it is a paused overlap.
        assert_eq!(at(&mut s, "E k 9 e - w 1", 6), "ok");
        assert_eq!(s.answer("S e", 9), "ok");
        assert_eq!(at(&mut s, "E k 10 f - r 1", 7), "ok");
        let c = counts(&mut s);
        assert_eq!((c.overlaps, c.paused_overlaps), (0, 1));
    }

    #[test]
    fn a_holder_cut_off_while_its_lease_is_valid_by_its_own_clock_is_an_overlap() {
        // lost-answer: a was granted the key again as it stood, so the store's expiry of its
        // lease is older than a's own `valid_until`; a is then cut off from the store (neither
        // stopped nor killed by the harness) and still inside, valid for a minute by its clock,
        // when b is granted: an overlap, never excused as a paused one. c, whose lease had run
        // out by its own clock, is a late holder beside d: a paused overlap.
        let valid = crate::process::group_guard::monotonic_ns() + 60_000_000_000;
        for (mode, permit) in [(Mode::Lock, ""), (Mode::Semaphore(1), " p 1")] {
            let mut s = State::new(mode);
            for (line, conn) in [
                (format!("E k 5 a {valid}{permit}"), 1),
                (format!("W k 5 a {valid}{permit}"), 1),
                (format!("E k 6 b {valid}{permit}"), 2),
                (format!("E j 5 c 1{permit}"), 3),
                (format!("E j 6 d {valid}{permit}"), 4),
            ] {
                assert_eq!(s.answer(&line, conn), "ok", "{mode:?}: {line}");
            }
            let c = counts(&mut s);
            assert_eq!(
                (c.overlaps, c.paused_overlaps, c.unsignalled),
                (1, 1, 1),
                "{mode:?}"
            );
        }
    }

    #[test]
    fn the_harness_learns_who_is_inside_and_who_entered_and_can_make_holders_leave() {
        let mut s = State::new(Mode::Semaphore(2));
        let before = crate::process::group_guard::monotonic_ns();
        assert_eq!(s.answer("I", 9), "inside");
        assert_eq!(s.answer("E k 5 a - p 1", 1), "ok");
        assert_eq!(s.answer("E k 6 b - p 1", 2), "ok");
        assert_eq!(s.answer("I", 9), "inside a b");
        assert_eq!(s.answer(&format!("F {before}"), 9), "entered a b");
        assert_eq!(s.answer(&format!("F {}", u64::MAX), 9), "entered");
        // Told to leave: each holder's next write is refused (once, and not counted).
        assert_eq!(s.answer("V", 9), "leaving a b");
        assert_eq!(s.answer("W k 5 a - p 1", 1), "leave");
        assert_eq!(s.answer("W k 5 a - p 1", 1), "ok");
        // b left before its next write: its next section is judged as any other.
        assert_eq!(s.answer("X k 6 b - p 1", 2), "ok");
        assert_eq!(s.answer("E k 7 b - p 1", 2), "ok");
        assert_eq!(s.answer("W k 7 b - p 1", 2), "ok");
        assert_eq!(s.answer("I", 9), "inside a b");
        let c = counts(&mut s);
        assert_eq!((c.sections, c.writes, c.overlaps), (3, 2, 0));
    }

    #[test]
    fn a_section_under_leasehold_run_lasts_while_its_process_lives() {
        let mut s = State::default();
        // a's command entered (valid `-`) on connection 1 and is still running long after:
        // b's entry is an overlap however late.
        assert_eq!(s.answer("E k 5 a -", 1), "ok");
        assert_eq!(s.section("E", "k", 6, ("b", 2), 1000, u64::MAX - 1), "ok");
        // c's command entered on connection 3 and was killed (the connection closed): d's entry
        // is no overlap.
        assert_eq!(s.answer("E j 5 c -", 3), "ok");
        s.closed(3);
        assert_eq!(s.answer("E j 6 d -", 4), "ok");
        // e said its stop signal fired before its lease ran out; f entered after: late, signalled.
        assert_eq!(s.section("E", "i", 5, ("e", 5), 1000, 100), "ok");
        assert_eq!(s.section("L", "i", 5, ("e", 5), 1000, 900), "ok");
        assert_eq!(s.section("E", "i", 6, ("f", 6), 1000, 1100), "ok");
        let c = Counts::from_json(&serde_json::from_str(&s.answer("Q", 9)).unwrap()).unwrap();
        assert_eq!(
            (c.sections, c.overlaps, c.paused_overlaps, c.unsignalled),
            (6, 1, 1, 0)
        );
    }
}
