//! The seed workload with real processes: 3 processes share 20 agents; every agent runs in exactly
//! one process; SIGTERM hands a process's agents to the others within one retry period; SIGKILL
//! hands them over after the TTL.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const AGENTS: usize = 20;
const TTL_MS: u64 = 2000;
const RETRY_MS: u64 = 300;

#[derive(Debug, Clone)]
struct Event {
    proc: usize,
    kind: String,
    agent: String,
    ns: u64,
}

struct Fleet {
    children: Vec<Child>,
    rx: mpsc::Receiver<Event>,
    events: Vec<Event>,
}

impl Fleet {
    fn start(url: &str, n: usize) -> Self {
        let (tx, rx) = mpsc::channel();
        let mut children = vec![];
        for p in 0..n {
            let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold-agents"))
                .args([
                    url,
                    &AGENTS.to_string(),
                    &TTL_MS.to_string(),
                    &RETRY_MS.to_string(),
                    "5000",
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn agents process");
            let out = BufReader::new(c.stdout.take().unwrap());
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    let f: Vec<&str> = line.split(' ').collect();
                    let (kind, agent) = (
                        f[0].to_owned(),
                        if f.len() > 2 {
                            f[1].to_owned()
                        } else {
                            String::new()
                        },
                    );
                    let ns = f.last().and_then(|s| s.parse().ok()).unwrap_or(0);
                    let _ = tx.send(Event {
                        proc: p,
                        kind,
                        agent,
                        ns,
                    });
                }
            });
            children.push(c);
        }
        Fleet {
            children,
            rx,
            events: vec![],
        }
    }

    /// Who runs each agent now, from the events so far.
    fn owners(&self) -> BTreeMap<String, usize> {
        owners_at(&self.events, u64::MAX)
    }

    /// Collects events until `done` holds, or panics after `limit`.
    fn until(&mut self, limit: Duration, what: &str, done: impl Fn(&Fleet) -> bool) -> Instant {
        let end = Instant::now() + limit;
        while !done(self) {
            let left = end
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("timed out waiting for {what}: {:?}", self.owners()));
            if let Ok(e) = self.rx.recv_timeout(left) {
                self.events.push(e);
            }
        }
        Instant::now()
    }

    fn signal(&self, p: usize, sig: i32) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.children[p].id() as i32, sig) }, 0);
    }

    /// No agent ever ran in two processes at once: per agent, start/stop intervals (by the
    /// monotonic clock shared by the processes) never overlap. `dead` gives, per killed process,
    /// the time it was killed (its agents stop then).
    fn check_exclusive(&self, dead: &HashMap<usize, u64>) {
        let mut events = self.events.clone();
        for (&p, &ns) in dead {
            for (agent, owner) in owners_at(&events, ns) {
                if owner == p {
                    events.push(Event {
                        proc: p,
                        kind: "stop".into(),
                        agent,
                        ns,
                    });
                }
            }
        }
        events.sort_by_key(|e| e.ns);
        let mut owner: HashMap<String, usize> = HashMap::new();
        for e in &events {
            match e.kind.as_str() {
                "start" => {
                    if let Some(o) = owner.insert(e.agent.clone(), e.proc) {
                        panic!(
                            "{} started in process {} while running in process {o}",
                            e.agent, e.proc
                        );
                    }
                }
                "stop" => {
                    owner.remove(&e.agent);
                }
                _ => {}
            }
        }
    }
}

fn owners_at(events: &[Event], ns: u64) -> BTreeMap<String, usize> {
    let mut sorted: Vec<&Event> = events.iter().filter(|e| e.ns <= ns).collect();
    sorted.sort_by_key(|e| e.ns);
    let mut owners = BTreeMap::new();
    for e in sorted {
        match e.kind.as_str() {
            "start" => {
                owners.insert(e.agent.clone(), e.proc);
            }
            "stop" => {
                owners.remove(&e.agent);
            }
            _ => {}
        }
    }
    owners
}

fn trading_agents_workload(url: &str) {
    let mut fleet = Fleet::start(url, 3);
    fleet.until(Duration::from_secs(10), "all agents running", |f| {
        f.owners().len() == AGENTS
    });
    let per_proc = |f: &Fleet, p: usize| f.owners().values().filter(|&&o| o == p).count();
    eprintln!(
        "agents per process: {} {} {}",
        per_proc(&fleet, 0),
        per_proc(&fleet, 1),
        per_proc(&fleet, 2)
    );

    // SIGTERM: process 0 stops its agents, releases, exits 0; the others take them over within
    // one retry period (plus scheduling slack).
    let victim = (0..3).max_by_key(|&p| per_proc(&fleet, p)).unwrap();
    fleet.signal(victim, libc::SIGTERM);
    let exited = fleet.until(
        Duration::from_secs(10),
        "the SIGTERMed process to exit",
        |f| {
            f.events
                .iter()
                .any(|e| e.proc == victim && e.kind == "exit")
        },
    );
    assert!(fleet.children[victim].wait().unwrap().success());
    assert_eq!(
        per_proc(&fleet, victim),
        0,
        "agents left running in the stopped process"
    );
    let retaken = fleet.until(
        Duration::from_secs(5),
        "orphans taken over after SIGTERM",
        |f| f.owners().len() == AGENTS,
    );
    let took = retaken.duration_since(exited);
    assert!(
        took < Duration::from_millis(RETRY_MS + 700),
        "orphans taken over after {took:?}, retry period is {RETRY_MS} ms"
    );

    // SIGKILL: the next process's agents are taken over by the last one after the TTL.
    let killed = (0..3)
        .filter(|&p| p != victim)
        .max_by_key(|&p| per_proc(&fleet, p))
        .unwrap();
    let survivor = (0..3).find(|&p| p != victim && p != killed).unwrap();
    let kill_ns = leasehold_testkit::mono_ns();
    let killed_at = Instant::now();
    fleet.signal(killed, libc::SIGKILL);
    let _ = fleet.children[killed].wait();
    let mut dead = HashMap::new();
    dead.insert(killed, kill_ns);
    let owners_before: BTreeMap<String, usize> = fleet.owners();
    let orphans: Vec<String> = owners_before
        .iter()
        .filter(|(_, &p)| p == killed)
        .map(|(a, _)| a.clone())
        .collect();
    let check = |f: &Fleet| {
        orphans.iter().all(|a| {
            f.events
                .iter()
                .any(|e| e.proc == survivor && e.kind == "start" && &e.agent == a && e.ns > kill_ns)
        })
    };
    let all_back = fleet.until(
        Duration::from_secs(10),
        "orphans taken over after SIGKILL",
        check,
    );
    let took = all_back.duration_since(killed_at);
    eprintln!("after SIGKILL the orphans were taken over in {took:?} (TTL {TTL_MS} ms)");
    assert!(
        took < Duration::from_millis(TTL_MS + RETRY_MS + 1000),
        "took {took:?}"
    );

    fleet.check_exclusive(&dead);
    fleet.signal(survivor, libc::SIGTERM);
    assert!(fleet.children[survivor].wait().unwrap().success());
}

#[test]
fn trading_agents_workload_on_redis() {
    let server = leasehold_testkit::servers::RedisServer::start();
    trading_agents_workload(&server.url());
}

#[test]
fn trading_agents_workload_on_a_redis_cluster() {
    let cluster = leasehold_testkit::servers::RedisCluster::start();
    trading_agents_workload(&format!("{}?prefix=agent:lock:", cluster.url()));
}

#[test]
fn trading_agents_workload_on_files() {
    let dir = tempfile::tempdir().unwrap();
    trading_agents_workload(&format!("file://{}", dir.path().display()));
}
