//! The fault harness: worker processes contend for one key and write each job's three steps to a
//! fenced resource (a storage service that rejects fences below the highest it has seen), while
//! the harness injects real faults — the holder paused (SIGSTOP) mid-job for longer than its TTL,
//! the holder killed (SIGKILL) mid-job and replaced by a new process, the store's servers paused
//! or restarted empty. Whatever happens, the writes the resource accepted come in fence order and
//! each fence belongs to one process; the paused holders' late steps are the writes it rejected;
//! and the lease keeps moving (progress). On the file store, one Redis server, 3-node Redlock, a
//! Redis Cluster and Kubernetes Leases (the project's API server).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::{redlock_url, ApiServer, Pausable, RedisCluster, RedisServer};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_leasehold-worker");
const TTL: Duration = Duration::from_millis(600);
const WORKERS: usize = 4;
const RUN: Duration = Duration::from_secs(9);

/// Worker processes contending for one key, writing to the fenced resource in `dir`.
struct Harness {
    url: String,
    key: String,
    dir: tempfile::TempDir,
    workers: Vec<Child>,
    end: Instant,
    pauses: usize,
}

/// One accepted (or rejected) write: fence, process, step (and, in the files, the time).
type Write = (u64, u32, u32);

impl Harness {
    fn start(url: &str) -> Self {
        let mut h = Harness {
            url: url.to_owned(),
            key: format!("chaos-{}", fastrand::u32(..)),
            dir: tempfile::tempdir().expect("tempdir"),
            workers: vec![],
            end: Instant::now() + RUN,
            pauses: 0,
        };
        for _ in 0..WORKERS {
            let w = h.spawn();
            h.workers.push(w);
        }
        h
    }

    /// Notes a fault in `DIR/faults` (`TIME what`, TIME as in the resource's files), so that a
    /// failure can be read as one timeline.
    fn note(&self, what: &str) {
        use std::io::Write as _;
        let line = format!("{} {what}\n", leasehold_testkit::mono_ns());
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.path().join("faults"))
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }

    /// A worker that runs until the harness's end.
    fn spawn(&self) -> Child {
        let left = self.end.saturating_duration_since(Instant::now());
        Command::new(WORKER)
            .args(["fenced", &self.url, &self.key])
            .arg(self.dir.path())
            .args([left.as_millis().to_string(), TTL.as_millis().to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn worker")
    }

    fn read(&self, name: &str) -> Vec<Write> {
        std::fs::read_to_string(self.dir.path().join(name))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let mut it = l.split(' ').map(|n| n.parse::<u64>().expect("number"));
                let (f, p, s) = (it.next(), it.next(), it.next());
                (
                    f.expect("fence"),
                    p.expect("pid") as u32,
                    s.expect("step") as u32,
                )
            })
            .collect()
    }

    /// The worker that has just written the first step of a job (so it is mid-job, holding the
    /// lease), found within 3 s.
    fn holder_mid_job(&self) -> Option<usize> {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Some(&(_, pid, 0)) = self.read("log").last() {
                if let Some(i) = self.workers.iter().position(|w| w.id() == pid) {
                    return Some(i);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    fn signal(&self, i: usize, sig: i32) {
        // SAFETY: kill(2) on our own, unreaped child.
        unsafe {
            libc::kill(self.workers[i].id() as i32, sig);
        }
    }

    /// Pauses the holder mid-job for 2.5 TTLs: the others take the lease over, and its two late
    /// steps must be rejected.
    fn pause_holder(&mut self) {
        if let Some(i) = self.holder_mid_job() {
            self.signal(i, libc::SIGSTOP);
            self.note(&format!("SIGSTOP {}", self.workers[i].id()));
            std::thread::sleep(TTL * 5 / 2);
            self.signal(i, libc::SIGCONT);
            self.note(&format!("SIGCONT {}", self.workers[i].id()));
            self.pauses += 1;
        }
    }

    /// Kills the holder mid-job and starts another worker in its place.
    fn kill_holder(&mut self) {
        if let Some(i) = self.holder_mid_job() {
            self.signal(i, libc::SIGKILL);
            self.note(&format!("SIGKILL {}", self.workers[i].id()));
            let _ = self.workers[i].wait();
            self.workers[i] = self.spawn();
            self.note(&format!("started {}", self.workers[i].id()));
        }
    }

    /// Runs `fault` (the store's own) between holder pauses and kills until the run's end nears,
    /// waits for the workers and checks what the resource accepted.
    fn run(mut self, mut fault: impl FnMut(&Self)) {
        while Instant::now() + TTL * 5 < self.end {
            self.pause_holder();
            std::thread::sleep(Duration::from_millis(100));
            self.kill_holder();
            std::thread::sleep(Duration::from_millis(100));
            fault(&self);
            std::thread::sleep(Duration::from_millis(100));
        }
        for w in &mut self.workers {
            let status = w.wait().expect("wait");
            assert!(status.success(), "a worker failed: {status}");
        }
        let (log, rejected) = (self.read("log"), self.read("rejected"));
        let mut problems = vec![];
        if let Some(w) = log.windows(2).find(|w| w[1].0 < w[0].0) {
            problems.push(format!(
                "the resource accepted fence {:?} after {:?}",
                w[1], w[0]
            ));
        }
        let mut owner: HashMap<u64, u32> = HashMap::new();
        for &(fence, pid, _) in &log {
            let first = *owner.entry(fence).or_insert(pid);
            if first != pid {
                problems.push(format!("fence {fence} granted to {first} and {pid}"));
                break;
            }
        }
        eprintln!(
            "{}: {} jobs, {} writes accepted, {} rejected, {} pauses",
            self.url,
            owner.len(),
            log.len(),
            rejected.len(),
            self.pauses
        );
        if owner.len() < 10 {
            problems.push(format!("only {} jobs", owner.len()));
        }
        if self.pauses == 0 {
            problems.push("no holder was paused".into());
        }
        if rejected.is_empty() {
            problems.push("no late write of a paused holder was rejected".into());
        }
        if !problems.is_empty() || std::env::var_os("LEASEHOLD_CHAOS_KEEP").is_some() {
            // The resource's files (log, rejected, faults: one timeline by their times).
            let kept = self.dir.keep();
            assert!(
                problems.is_empty(),
                "{}: {problems:?}; the files are in {kept:?}",
                self.url
            );
            eprintln!("kept in {kept:?}");
        }
    }
}

#[test]
fn on_files_through_holder_pauses_and_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    Harness::start(&format!("file://{}", dir.path().display())).run(|_| {});
}

/// The server is paused past the TTL too: every holder loses its lease, and the lease goes on when
/// the server is back.
#[test]
fn on_redis_through_holder_pauses_kills_and_a_paused_server() {
    let server = RedisServer::start();
    Harness::start(&format!("{}?timeout=300ms", server.url())).run(|h| {
        server.pause();
        h.note("server SIGSTOP");
        std::thread::sleep(TTL * 3 / 2);
        server.resume();
        h.note("server SIGCONT");
    });
}

/// One node at a time is paused past the TTL, and one is restarted empty once: a majority always
/// remembers the lease, so neither breaks exclusion.
#[test]
fn on_redlock_through_holder_pauses_kills_and_node_faults() {
    let mut nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = redlock_url(&nodes);
    let mut round = 0;
    Harness::start(&url).run(|h| {
        round += 1;
        let n = round % nodes.len();
        if round == 2 {
            let port = nodes[n].port;
            nodes[n].stop();
            nodes[n] = RedisServer::start_on(port);
            h.note(&format!("node {n} restarted empty"));
        } else {
            nodes[n].pause();
            h.note(&format!("node {n} SIGSTOP"));
            std::thread::sleep(TTL * 3 / 2);
            nodes[n].resume();
            h.note(&format!("node {n} SIGCONT"));
        }
    });
}

/// The key's slot is failed over to its replica and back (`CLUSTER FAILOVER`, which loses no write)
/// while the holders are paused and killed: the store follows the slot, and the fences stay in order
/// across the primaries.
#[test]
fn on_a_redis_cluster_through_holder_pauses_kills_and_failovers() {
    let cluster = RedisCluster::start();
    Harness::start(&format!("{}?timeout=500ms", cluster.url())).run(|h| {
        let name = format!("leasehold:lock:{{{}}}", h.key);
        let Some(primary) = cluster.primary_for(&name) else {
            return;
        };
        let Some(replica) = cluster.replicas_of(primary.port).into_iter().next() else {
            return;
        };
        let port = replica.port;
        replica.command(&["CLUSTER", "FAILOVER"]);
        h.note(&format!("CLUSTER FAILOVER to {port}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.primary_for(&name).is_none_or(|p| p.port != port) {
            assert!(Instant::now() < deadline, "no failover to {port} in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        h.note(&format!("{port} serves the key"));
    });
}

/// Kubernetes Leases on the project's API server, which is paused past the TTL too (its
/// connections stay open and silent): every holder loses its lease, and the lease goes on when the
/// server answers again.
#[test]
fn on_kubernetes_through_holder_pauses_kills_and_a_paused_api_server() {
    let api = ApiServer::start();
    Harness::start(&format!("{}&timeout=300ms", api.store_url("default"))).run(|h| {
        api.pause();
        h.note("API server SIGSTOP");
        std::thread::sleep(TTL * 3 / 2);
        api.resume();
        h.note("API server SIGCONT");
    });
}
