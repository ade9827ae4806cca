//! `leasehold torture`: exclusion and fencing checked under real faults, with real processes.
//!
//! The harness starts a fenced resource ([`resource`], a process of its own) and `--clients`
//! client processes ([`client`]; `leasehold` itself, each its own holder) that take leases on
//! `--keys` keys and write to the resource under each, through the library or through
//! `leasehold run` and its command (`--via`). For each fault of `--faults` in turn it runs
//! the clients for its share of `--duration`, injecting that fault at seeded random times:
//! * `none` — no fault;
//! * `kill` — SIGKILL of a client (a crash while holding, most of the time), then a new client;
//! * `stop` — SIGSTOP of a client for 1.5 TTLs, then SIGCONT (a GC pause: it wakes believing it
//!   holds);
//! * `partition` — one client, or all of them, cut off from the store by the harness's TCP
//!   proxies: latency, a black hole or resets ([`network`]); on an etcd cluster started here,
//!   one time in three a member cut from its peers instead;
//! * `lost-answer` — through the same proxies, the store's answers to some clients swallowed
//!   while their requests are applied, their connections then reset (they retry what they
//!   sent), and the first of them to enter a critical section cut off for 1.5 TTLs: a grant the
//!   store answers again as it stood, its expiry counted from the first request while the client
//!   counts from the retry, shows as an overlap ([`lose_answers`]);
//! * `clock` — clients whose wall clock is minutes ahead or behind (an hour on the object stores) ([`clock`]).
//! * `restart` — a store restart or failover, per kind ([`servers`]; only for servers started
//!   here).
//!
//! The resource judges each request as it receives it and counts per phase: critical sections,
//! **overlaps** (a client entered a key's section while another, neither stopped nor killed, was
//! still inside it: an exclusion violation), **paused overlaps** (the same while the earlier one
//! was stopped: what no lock prevents), requests **caught by the fence** (below the key's highest
//! fence), and **fence violations** (a new grant whose fence is not above the key's highest).
//! Overlaps and fence violations break a promise: the exit status is then 1. Where the store does
//! not promise exclusion or fences under a fault ([`servers::StoreKind::promises`]: a Redis server restarted
//! empty), they are counted apart as **unpromised** and leave the exit status alone; once a phase
//! lost fences, later phases do not promise them either (the store's counters restarted below
//! the resource's highest fence).
//!
//! `memory` runs every client on an in-process store of its own, so nothing excludes anything
//! across processes: the checker must report overlaps and exit 1 (the proof it can fail).
//!
//! With `--permits N` the keys are semaphores of N permits and with `--read-write` read-write
//! locks ([`Mode`]); clients take one permit each (a third of them, picked at random, the write
//! permit). The resource then counts as an overlap a client entering while N others (a writer:
//! anyone; a reader: a writer), neither stopped nor killed and with valid permits, are inside,
//! and as a fence violation a grant whose fence is not above every fence entered before it
//! asked, or, on a read-write lock, not above the last writer's (a writer: the last fence
//! entered): see [`resource`]. On the memory store every client's permits are its own, so a
//! semaphore overlaps as soon as N+1 clients pick one key, and a writer as soon as anyone is
//! beside it; `--permits` below `--clients` is required, so that the canary can fail.

pub(crate) mod client;
pub(crate) mod clock;
pub(crate) mod network;
pub(crate) mod resource;
pub(crate) mod servers;

use crate::cli::{Fault, TortureArgs, Via};
use crate::exit::{Failure, ERROR, OK, USAGE};
use crate::valid::TorturePlan;
use leasehold::ExpiryClock;
use resource::{Counts, Resource};
use servers::{Promise, Stores};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The hidden first argument of the harness's own processes.
pub(crate) const ARG: &str = "__torture";

/// What the keys of a run are: locks, semaphores of some permits, or read-write locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Locks: one client inside a key at a time.
    Lock,
    /// Semaphores of this many permits: at most that many clients inside a key.
    Semaphore(u32),
    /// Read-write locks: readers together, or one writer.
    ReadWrite,
}

impl Mode {
    /// The mode `--permits` and `--read-write` ask for.
    pub(crate) fn of(args: &TortureArgs) -> Mode {
        match (args.permits, args.read_write) {
            (Some(n), _) => Mode::Semaphore(n),
            (None, true) => Mode::ReadWrite,
            (None, false) => Mode::Lock,
        }
    }

    /// Its form on the harness's own command lines: `lock`, `semaphore:N`, `read-write`.
    pub(crate) fn arg(self) -> String {
        match self {
            Mode::Lock => "lock".into(),
            Mode::Semaphore(n) => format!("semaphore:{n}"),
            Mode::ReadWrite => "read-write".into(),
        }
    }

    /// Read back from [`Mode::arg`].
    pub(crate) fn parse(s: &str) -> Option<Mode> {
        match s {
            "lock" => Some(Mode::Lock),
            "read-write" => Some(Mode::ReadWrite),
            _ => s
                .strip_prefix("semaphore:")
                .and_then(|n| n.parse().ok())
                .filter(|n| (1..=leasehold::PERMIT_LIMIT).contains(n))
                .map(Mode::Semaphore),
        }
    }

    /// What the keys are, for people.
    fn describe(self) -> String {
        match self {
            Mode::Lock => "locks".into(),
            Mode::Semaphore(1) => "semaphores of 1 permit".into(),
            Mode::Semaphore(n) => format!("semaphores of {n} permits"),
            Mode::ReadWrite => "read-write locks".into(),
        }
    }
}

/// The `main` of `leasehold __torture resource SOCKET MODE [HISTORY]`, `leasehold __torture client
/// URL SOCKET ID KEYS TTL_MS SEED VIA MODE HOLD_MS`, `leasehold __torture section SOCKET KEY ID
/// HOLD_MS [ROLE START]` and `leasehold __torture open URL MODE`.
pub(crate) fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let result = match args.as_slice() {
        [what] if what == clock::CLOCKS => clock::print(),
        [what, url, mode] if what == "open" => match (crate::setup::runtime(), Mode::parse(mode)) {
            (Some(rt), Some(mode)) => rt.block_on(open(url, mode)),
            (None, _) => Err("no runtime".into()),
            (_, None) => Err(format!("bad mode {mode:?}")),
        },
        [what, socket, mode, history @ ..] if what == "resource" && history.len() <= 1 => {
            match Mode::parse(mode) {
                Some(mode) => {
                    resource::serve(Path::new(socket), mode, history.first().map(Path::new))
                        .map_err(|e| format!("resource: {e}"))
                }
                None => Err(format!("bad mode {mode:?}")),
            }
        }
        [what, socket, key, id, hold_ms, permit @ ..]
            if what == "section" && matches!(permit.len(), 0 | 2) =>
        {
            let permit = match permit {
                [role, start] => match (resource::Role::parse(role), start.parse::<u64>()) {
                    (Some(role), Ok(start)) => Ok(Some((role, start))),
                    _ => Err("bad section arguments".to_owned()),
                },
                _ => Ok(None),
            };
            let hold = hold_ms
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| "bad section arguments".to_owned());
            permit.and_then(|permit| {
                client::section(Path::new(socket), key, id, hold?, permit)
                    .map_err(|e| format!("section: {e}"))
            })
        }
        [what, url, socket, id, keys, ttl_ms, seed, via, mode, hold_ms] if what == "client" => {
            match (
                keys.parse(),
                ttl_ms.parse(),
                seed.parse(),
                Via::parse(via),
                Mode::parse(mode),
                hold_ms.parse(),
            ) {
                (Ok(keys), Ok(ttl_ms), Ok(seed), Some(via), Some(mode), Ok(hold_ms)) => {
                    match crate::setup::runtime() {
                        Some(rt) => rt.block_on(client::run(client::Plan {
                            url,
                            socket: Path::new(socket),
                            id,
                            keys,
                            ttl: Duration::from_millis(ttl_ms),
                            seed,
                            via,
                            mode,
                            hold: Duration::from_millis(hold_ms),
                        })),
                        None => Err("no runtime".into()),
                    }
                }
                _ => Err("bad client arguments".into()),
            }
        }
        _ => Err(
            "usage: leasehold __torture resource SOCKET MODE [HISTORY] | client URL SOCKET ID KEYS TTL_MS SEED VIA MODE HOLD_MS | section SOCKET KEY ID HOLD_MS [ROLE START] | open URL MODE"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            crate::exit::report(&format!("torture: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Opens the store at `url` as a client would, and prints whose clock judges its expiry
/// ([`clock::word`]); for a mode of permits, a store that holds none is refused here, once.
async fn open(url: &str, mode: Mode) -> Result<(), String> {
    let store = leasehold::open_store(url)
        .await
        .map_err(|e| e.to_string())?;
    if mode != Mode::Lock && !store.capabilities().permits {
        return Err(format!(
            "{} holds locks only, not {}",
            leasehold::redact_url(url),
            mode.describe()
        ));
    }
    crate::output::outln!("{}", clock::word(store.capabilities().expiry_clock));
    Ok(())
}

/// One phase's figures.
#[derive(Debug, Clone)]
struct Row {
    fault: String,
    injected: u64,
    counts: Counts,
    /// What the store promised in this phase.
    promise: Promise,
    /// Overlaps and fence violations where they were not promised (moved out of `counts`).
    unpromised_overlaps: u64,
    unpromised_fence_violations: u64,
}

/// Runs the harness (see the module documentation) as `plan` says.
pub(crate) async fn torture(plan: TorturePlan) -> Result<u8, Failure> {
    let seed = plan.seed;
    crate::output::errln!(
        "leasehold torture: seed {seed} (--seed {seed} replays this fault schedule)"
    );
    let note = plan.source.note();
    if let Some(n) = note {
        crate::output::errln!("leasehold torture: {n}");
    }
    let dir = std::env::temp_dir().join(format!("leasehold-torture-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::new(ERROR, format!("{}: {e}", dir.display())))?;
    let outcome = harness(&plan, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = outcome?;
    let broken = rows
        .iter()
        .any(|r| r.counts.overlaps > 0 || r.counts.fence_violations > 0);
    print_rows(&plan, &rows, note);
    // A run in which no client ever entered checked nothing (a store it cannot use, say).
    let idle = rows.iter().all(|r| r.counts.sections == 0);
    if idle {
        crate::output::errln!(
            "leasehold torture: no client entered a critical section: nothing was checked"
        );
    }
    Ok(if broken || idle { ERROR } else { OK })
}

/// Starts the store and the resource in `dir`, and runs the phases: their figures.
async fn harness(plan: &TorturePlan, dir: &Path) -> Result<Vec<Row>, Failure> {
    let args = &plan.args;
    let partition = args.faults.contains(&Fault::Partition);
    let stores = Stores::start(&plan.source, dir, partition).await?;
    let expiry_clock = open_once(&stores, plan.mode).await?;
    let socket = dir.join("resource.sock");
    let mut resource_process = start_resource(&socket, plan)?;
    let resource = connect_resource(&socket).await?;
    let mut run = Run {
        plan,
        store: stores.url().to_owned(),
        expiry_clock,
        stores,
        socket,
        resource,
    };
    let share = args.duration / u32::try_from(args.faults.len().max(1)).unwrap_or(1);
    let mut rows = vec![];
    let mut fences_lost = false;
    for (n, &fault) in args.faults.iter().enumerate() {
        let phase_seed = plan.seed.wrapping_add(1_000_003 * n as u64);
        let mut promise = plan.source.promises(fault);
        promise.fences &= !fences_lost;
        fences_lost |= !promise.fences;
        rows.push(run.phase(fault, promise, share, phase_seed).await?);
    }
    let _ = resource_process.start_kill();
    let _ = resource_process.wait().await;
    run.stores.stop();
    Ok(rows)
}

/// Opens the store once, as a client would (its environment), before any client starts, so that
/// a store that cannot be opened is said once: whose clock judges its expiry, as it says.
async fn open_once(stores: &Stores, mode: Mode) -> Result<ExpiryClock, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(ERROR, format!("cannot find the leasehold executable: {e}")))?;
    let opened = Command::new(exe)
        .args([ARG, "open", stores.url(), &mode.arg()])
        .envs(stores.env().iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| Failure::new(ERROR, format!("cannot start a torture process: {e}")))?;
    if !opened.status.success() {
        let why = String::from_utf8_lossy(&opened.stderr);
        let why = why.trim().trim_start_matches("leasehold: torture: ");
        // What the store URL names cannot be opened: known only by trying.
        return Err(Failure::new(USAGE, format!("cannot open the store: {why}")));
    }
    let said = String::from_utf8_lossy(&opened.stdout);
    clock::from_word(said.trim()).ok_or_else(|| {
        Failure::new(
            ERROR,
            format!("opening the store said {said:?} for its expiry clock"),
        )
    })
}

/// Starts the fenced resource on `socket` (writing its history where `--history` says).
fn start_resource(socket: &Path, plan: &TorturePlan) -> Result<Child, Failure> {
    let mut resource_args = vec![
        "resource".to_owned(),
        socket.display().to_string(),
        plan.mode.arg(),
    ];
    if let Some(h) = &plan.args.history {
        resource_args.push(h.display().to_string());
    }
    let resource_args: Vec<&str> = resource_args.iter().map(String::as_str).collect();
    spawn_self(&resource_args, &[])
}

/// What every phase of one run shares: its plan, the store (its URL and its servers), and the
/// resource the clients write to.
struct Run<'a> {
    plan: &'a TorturePlan,
    store: String,
    /// Whose clock judges the store's expiry (as the store said when opened).
    expiry_clock: ExpiryClock,
    stores: Stores,
    socket: std::path::PathBuf,
    resource: Resource,
}

impl Run<'_> {
    /// One phase: the clients run for `duration` while `fault` is injected (seeded by `seed`);
    /// its figures, judged by what the store `promise`s under that fault.
    async fn phase(
        &mut self,
        fault: Fault,
        promise: Promise,
        duration: Duration,
        seed: u64,
    ) -> Result<Row, Failure> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let network = Network::for_fault(fault, &self.store, &self.plan.args).await?;
        let skews = Skews::for_fault(fault, self.expiry_clock).await?;
        let mut phase = Phase::new(self, fault, (network, skews), seed);
        phase.start_clients(&mut rng)?;
        self.drive(&mut phase, &mut rng, duration).await?;
        phase.say_what_was_cut();
        phase.end(&mut self.resource).await?;
        figures(&mut self.resource, fault, phase.injected, promise)
    }

    /// Injects the phase's fault at seeded random times (between half a TTL and one and a half
    /// apart) for `duration`, with a progress bar on a terminal.
    async fn drive(
        &mut self,
        phase: &mut Phase<'_>,
        rng: &mut fastrand::Rng,
        duration: Duration,
    ) -> Result<(), Failure> {
        let ttl = self.plan.args.ttl;
        let start = Instant::now();
        let end = start + duration;
        // On a terminal (and not with --json), a bar that tells how the phase goes.
        let bar = crate::progress::bar(
            duration.as_secs(),
            "{prefix:>12} [{bar:30}] {pos}/{len}s  {msg}",
            !self.plan.args.json,
        );
        bar.set_prefix(phase.fault.as_str());
        let mut shown: Option<Instant> = None;
        while Instant::now() < end {
            if !bar.is_hidden() && shown.is_none_or(|s| s.elapsed() >= Duration::from_secs(1)) {
                shown = Some(Instant::now());
                bar.set_position(start.elapsed().as_secs());
                bar.set_message(progress_message(&mut self.resource, phase.injected)?);
            }
            let next = Instant::now() + ttl.mul_f64(0.5 + rng.f64());
            tokio::time::sleep_until(next.min(end)).await;
            if Instant::now() >= end {
                break;
            }
            self.inject(phase, rng).await?;
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Injects the phase's fault once, on a client picked by `rng` where it takes one.
    async fn inject(
        &mut self,
        phase: &mut Phase<'_>,
        rng: &mut fastrand::Rng,
    ) -> Result<(), Failure> {
        let ttl = self.plan.args.ttl;
        let resource = &mut self.resource;
        let i = rng.usize(..phase.clients.len());
        let pid = phase.clients[i].1.id();
        match (phase.fault, pid) {
            (Fault::Kill, Some(_)) => phase.replace(resource, i, None).await?,
            (Fault::Partition, _) => {
                let peers = self.stores.peers();
                let members = peers.map_or(0, |p| p.members());
                let cut = network::Cut::pick(rng, phase.network.routes.len(), members, ttl);
                if let network::Whom::Member(m) = cut.whom {
                    if let Some(n) = phase.member_cuts.get_mut(m) {
                        *n += 1;
                    }
                }
                cut.apply(&phase.network.routes, peers).await;
            }
            (Fault::LostAnswer, _) => {
                let ids: Vec<&str> = phase.clients.iter().map(|(id, _)| id.as_str()).collect();
                let routes = &phase.network.routes;
                let timeout = phase.network.timeout;
                let lost = lose_answers(resource, routes, &ids, rng, timeout, ttl).await?;
                phase.cut_off += u64::from(lost);
            }
            (Fault::Clock, Some(_)) => {
                let skew = phase.skews.next(rng, true);
                phase.replace(resource, i, skew).await?;
            }
            (Fault::Stop, Some(pid)) => {
                ask(resource, &format!("S {}", phase.clients[i].0))?;
                signal_group(pid, libc::SIGSTOP);
                tokio::time::sleep(ttl * 3 / 2).await;
                signal_group(pid, libc::SIGCONT);
            }
            (Fault::Restart, _) => self.stores.restart(rng, ttl).await?,
            _ => return Ok(()),
        }
        phase.injected += 1;
        Ok(())
    }
}

/// How a phase's clients reach the store. `partition`, `lost-answer`: each client through
/// proxies of its own. `lost-answer`: the clients' store calls time out after 2/5 of the TTL
/// unless the URL says otherwise, so that a call whose answer is lost is sent again within the
/// lease's life; and their critical sections last a TTL, so that a holder cut off is still
/// inside when its lease could expire.
struct Network {
    /// Each client's proxies (none: the clients reach the store directly).
    routes: Vec<network::Route>,
    /// The clients' per-call timeout (`lost-answer`).
    timeout: Duration,
    /// How long a critical section goes on writing, at least.
    hold: Duration,
}

impl Network {
    /// The clients' way to `store` under `fault`. Whether the store can be proxied was checked
    /// before the run ([`crate::valid`]): what fails here is the machine's.
    async fn for_fault(fault: Fault, store: &str, args: &TortureArgs) -> Result<Network, Failure> {
        let mut network = Network {
            routes: vec![],
            timeout: Duration::ZERO,
            hold: Duration::ZERO,
        };
        if !matches!(fault, Fault::Partition | Fault::LostAnswer) {
            return Ok(network);
        }
        let url = if fault == Fault::LostAnswer {
            let (url, t) = network::with_timeout(store, args.ttl * 2 / 5)
                .map_err(|e| Failure::new(ERROR, format!("{fault}: {e}")))?;
            if t >= args.ttl {
                crate::output::errln!(
                    "leasehold torture: {fault}: the store's timeout ({}) is not below the TTL ({}): a call whose answer is lost is sent again after the lease could expire, and the fault shows nothing",
                    crate::output::duration(t),
                    crate::output::duration(args.ttl)
                );
            }
            network.timeout = t;
            network.hold = args.ttl;
            url
        } else {
            store.to_owned()
        };
        for _ in 0..args.clients {
            let route =
                network::Route::new(&url, fault.as_str()).map_err(|e| Failure::new(ERROR, e))?;
            network.routes.push(route);
        }
        Ok(network)
    }
}

/// The wall-clock skews of a phase's clients. `clock`: a seeded half of the clients starts with
/// a skewed wall clock, and each injection replaces a client with a skewed one, ahead and behind
/// in turn; other faults skew no clock.
struct Skews {
    clock: bool,
    given: [&'static str; 2],
    taken: usize,
}

impl Skews {
    /// The skews of `fault`, for a store whose expiry `expiry_clock` judges; checked to move the
    /// wall clock only ([`clock::check`]).
    async fn for_fault(fault: Fault, expiry_clock: ExpiryClock) -> Result<Skews, Failure> {
        let skews = Skews {
            clock: fault == Fault::Clock,
            given: clock::skews(expiry_clock),
            taken: 0,
        };
        if skews.clock {
            for s in skews.given {
                clock::check(s).await?;
            }
        }
        Ok(skews)
    }

    /// The skew of the next client: one always (`always`) or one time in two under `clock`.
    fn next(&mut self, rng: &mut fastrand::Rng, always: bool) -> Option<&'static str> {
        (self.clock && (always || rng.bool())).then(|| {
            self.taken += 1;
            self.given[self.taken % 2]
        })
    }
}

/// One phase under way: its clients and what was injected.
struct Phase<'a> {
    fault: Fault,
    args: &'a TortureArgs,
    /// The keys' mode, as the clients take it.
    mode: String,
    store: String,
    socket: String,
    /// The environment the store's clients need.
    env: Vec<(String, String)>,
    network: Network,
    skews: Skews,
    /// The phase's seed, of which each client's is derived.
    seed: u64,
    /// Each client's id and process.
    clients: Vec<(String, Child)>,
    /// The next replacement client's generation.
    generation: u32,
    injected: u64,
    /// lost-answer: the injections after which a client was cut off.
    cut_off: u64,
    /// partition: the cuts of each member of a cluster started here from its peers.
    member_cuts: Vec<u64>,
}

impl<'a> Phase<'a> {
    /// Phase `fault` of `run`, its clients seeded from `seed`, reaching the store as `network`
    /// says with their clocks skewed as `skews` says.
    fn new(
        run: &Run<'a>,
        fault: Fault,
        (network, skews): (Network, Skews),
        seed: u64,
    ) -> Phase<'a> {
        Phase {
            fault,
            args: &run.plan.args,
            mode: run.plan.mode.arg(),
            store: run.store.clone(),
            socket: run.socket.display().to_string(),
            env: run.stores.env().to_vec(),
            network,
            skews,
            seed,
            clients: vec![],
            generation: 1,
            injected: 0,
            cut_off: 0,
            member_cuts: vec![0; run.stores.peers().map_or(0, |p| p.members())],
        }
    }

    /// Starts the clients (generation 0), their clocks skewed as [`Skews`] says.
    fn start_clients(&mut self, rng: &mut fastrand::Rng) -> Result<(), Failure> {
        for i in 0..self.args.clients {
            let skewed = self.skews.next(rng, false);
            self.injected += u64::from(skewed.is_some());
            let client = self.spawn(i, 0, skewed)?;
            self.clients.push(client);
        }
        Ok(())
    }

    /// Starts client `i` of `generation`, its wall clock moved by `skew`: its id and process.
    fn spawn(
        &self,
        i: usize,
        generation: u32,
        skew: Option<&str>,
    ) -> Result<(String, Child), Failure> {
        let args = self.args;
        let id = format!("{}-c{i}g{generation}", self.fault);
        let mut env = self.env.clone();
        for (k, v) in skew.map(clock::env).transpose()?.unwrap_or_default() {
            env.push((k.to_owned(), v));
        }
        let seed = self
            .seed
            .wrapping_add(i as u64 * 7919 + u64::from(generation));
        let child = spawn_self(
            &[
                "client",
                self.network.routes.get(i).map_or(&self.store, |r| &r.url),
                &self.socket,
                &id,
                &args.keys.to_string(),
                &args.ttl.as_millis().to_string(),
                &seed.to_string(),
                args.via[i % args.via.len()].as_str(),
                &self.mode,
                &self.network.hold.as_millis().to_string(),
            ],
            &env,
        )?;
        Ok((id, child))
    }

    /// Kills client `i` and starts its replacement (the next generation), its wall clock moved
    /// by `skew`.
    async fn replace(
        &mut self,
        resource: &mut Resource,
        i: usize,
        skew: Option<&str>,
    ) -> Result<(), Failure> {
        let (id, child) = &mut self.clients[i];
        kill_client(resource, id, child).await?;
        self.clients[i] = self.spawn(i, self.generation, skew)?;
        self.generation += 1;
        Ok(())
    }

    /// Says what `partition` cut (members of a cluster, clients) and after how many `lost-answer`
    /// injections a client was cut off.
    fn say_what_was_cut(&self) {
        let injected = self.injected;
        if self.fault == Fault::Partition && !self.member_cuts.is_empty() {
            let of_members: u64 = self.member_cuts.iter().sum();
            let each: Vec<String> = self
                .member_cuts
                .iter()
                .enumerate()
                .map(|(m, n)| format!("m{m} {n}"))
                .collect();
            crate::output::errln!(
                "leasehold torture: partition: {of_members} of {injected} cuts were a member cut from its peers ({}), {} cut clients off",
                each.join(", "),
                injected - of_members
            );
        }
        if self.fault == Fault::LostAnswer {
            crate::output::errln!(
                "leasehold torture: lost-answer: after {} of {injected} injections a client whose answers were lost entered a critical section, and was cut off",
                self.cut_off
            );
        }
    }

    /// Kills the clients, then stops the proxies.
    async fn end(&mut self, resource: &mut Resource) -> Result<(), Failure> {
        for (id, mut child) in std::mem::take(&mut self.clients) {
            kill_client(resource, &id, &mut child).await?;
        }
        self.network.routes.clear();
        Ok(())
    }
}

/// A phase's row: the resource's counts since the last phase, the overlaps and fence violations
/// where the store did not `promise` them moved apart.
fn figures(
    resource: &mut Resource,
    fault: Fault,
    injected: u64,
    promise: Promise,
) -> Result<Row, Failure> {
    let answer = ask(resource, "Q")?;
    let mut counts: Counts = serde_json::from_str(&answer)
        .ok()
        .and_then(|v| Counts::from_json(&v))
        .ok_or_else(|| Failure::new(ERROR, format!("the fenced resource answered {answer:?}")))?;
    let unpromised_overlaps = if promise.exclusion {
        0
    } else {
        std::mem::take(&mut counts.overlaps)
    };
    let unpromised_fence_violations = if promise.fences {
        0
    } else {
        std::mem::take(&mut counts.fence_violations)
    };
    Ok(Row {
        fault: fault.as_str().to_owned(),
        injected,
        counts,
        promise,
        unpromised_overlaps,
        unpromised_fence_violations,
    })
}

/// One injection of `lost-answer` (see [`network::LostAnswers`]): the answers of some of the
/// clients (`ids`, each on its route) lost while the holders leave their sections and the next
/// grants are made, until the calls time out; then their connections reset, and the first of
/// them to enter a critical section within a TTL cut off for 1.5 TTL (a holder whose lease the
/// store counts from a call older than the one it heard would be inside, valid by its own clock,
/// when another client is granted the lease). Whether a client was cut off.
async fn lose_answers(
    resource: &mut Resource,
    routes: &[network::Route],
    ids: &[&str],
    rng: &mut fastrand::Rng,
    timeout: Duration,
    ttl: Duration,
) -> Result<bool, Failure> {
    let answer = ask(resource, "I")?;
    let inside: Vec<&str> = answer.split(' ').skip(1).collect();
    let waiting: Vec<usize> = (0..ids.len())
        .filter(|i| !inside.contains(&ids[*i]))
        .collect();
    let lost = network::LostAnswers::pick(rng, ids.len(), &waiting, timeout, ttl);
    lost.set(routes, network::Link::Mute);
    // The holders leave at their next write; once they have (within the timeout), the next
    // grants are made while the answers are lost.
    let answer = ask(resource, "V")?;
    let leaving: Vec<&str> = answer.split(' ').skip(1).collect();
    let by = Instant::now() + timeout;
    while Instant::now() < by {
        let answer = ask(resource, "I")?;
        if !answer.split(' ').skip(1).any(|c| leaving.contains(&c)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(lost.after_leaving).await;
    lost.set(routes, network::Link::Up);
    let since = crate::process::group_guard::monotonic_ns();
    let until = Instant::now() + ttl;
    loop {
        let answer = ask(resource, &format!("F {since}"))?;
        let entered: Vec<&str> = answer.split(' ').skip(1).collect();
        if let Some(&c) = lost
            .muted
            .iter()
            .find(|c| ids.get(**c).is_some_and(|id| entered.contains(id)))
        {
            lost.cut_off(routes, c).await;
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// How the phase goes so far: sections, faults injected and violations (the resource's counts,
/// read without resetting them).
fn progress_message(resource: &mut Resource, injected: u64) -> Result<String, Failure> {
    let answer = ask(resource, "P")?;
    Ok(serde_json::from_str(&answer)
        .ok()
        .and_then(|v| Counts::from_json(&v))
        .map(|c| {
            format!(
                "{} sections, {injected} faults, {} overlaps, {} fence violations",
                c.sections, c.overlaps, c.fence_violations
            )
        })
        .unwrap_or_default())
}

/// Sends the resource one request; its answer.
fn ask(resource: &mut Resource, request: &str) -> Result<String, Failure> {
    resource
        .ask(request)
        .map_err(|e| Failure::new(ERROR, format!("the fenced resource: {e}")))
}

/// Kills client `id` (SIGKILL to its process group: the client and its `leasehold run`) and waits
/// for it, telling the resource first that it is dying (a section it is in excuses the next
/// entrant) and then that it is gone (its section ends).
async fn kill_client(resource: &mut Resource, id: &str, child: &mut Child) -> Result<(), Failure> {
    ask(resource, &format!("D {id}"))?;
    match child.id() {
        Some(pid) => signal_group(pid, libc::SIGKILL),
        None => {
            let _ = child.start_kill();
        }
    }
    let _ = child.wait().await;
    ask(resource, &format!("K {id}"))?;
    Ok(())
}

/// Sends `sig` to the process group a client leads: the client and, for a `leasehold run` client,
/// that `leasehold` (whose command runs in a group of its own, under its guard).
fn signal_group(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) on the group of a child of ours, which leads it and is not yet reaped,
        // so the group id is not reused.
        unsafe { libc::kill(-pid, sig) };
    }
}

/// Starts `leasehold __torture ARGS…` with `env` added to its environment, dying with this
/// process.
fn spawn_self(args: &[&str], env: &[(String, String)]) -> Result<Child, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(ERROR, format!("cannot find the leasehold executable: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.arg(ARG)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0);
    crate::process::child::die_with_parent(&mut cmd);
    cmd.spawn()
        .map_err(|e| Failure::new(ERROR, format!("cannot start a torture process: {e}")))
}

/// Connects to the resource once it listens (within 5 s).
async fn connect_resource(socket: &Path) -> Result<Resource, Failure> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match Resource::connect(socket) {
            Ok(r) => return Ok(r),
            Err(e) if Instant::now() >= until => {
                return Err(Failure::new(
                    ERROR,
                    format!("the fenced resource did not start: {e}"),
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

fn print_rows(plan: &TorturePlan, rows: &[Row], note: Option<&str>) {
    let (args, seed) = (&plan.args, plan.seed);
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut v = r.counts.json();
                v["store"] = args.kind.clone().into();
                v["fault"] = r.fault.clone().into();
                v["faults_injected"] = r.injected.into();
                v["unpromised_overlaps"] = r.unpromised_overlaps.into();
                v["unpromised_fence_violations"] = r.unpromised_fence_violations.into();
                v["promised"] = serde_json::json!({
                    "exclusion": r.promise.exclusion, "fences": r.promise.fences,
                });
                v["mode"] = plan.mode.arg().into();
                v
            })
            .collect();
        crate::output::outln!("{}", serde_json::json!({ "seed": seed, "rows": rows }));
        return;
    }
    crate::output::outln!(
        "{:<14} {:<11} {:>9} {:>7} {:>9} {:>15} {:>13} {:>16} {:>12} {:>10}",
        "STORE",
        "FAULT",
        "SECTIONS",
        "FAULTS",
        "OVERLAPS",
        "PAUSED-OVERLAPS",
        "FENCE-CAUGHT",
        "FENCE-VIOLATIONS",
        "UNSIGNALLED",
        "UNPROMISED"
    );
    for r in rows {
        let c = r.counts;
        // Overlaps / fence violations where the store promises neither: caught by the fence.
        let unpromised = if r.promise.exclusion && r.promise.fences {
            "-".to_owned()
        } else {
            format!(
                "{}/{}",
                r.unpromised_overlaps, r.unpromised_fence_violations
            )
        };
        crate::output::outln!(
            "{:<14} {:<11} {:>9} {:>7} {:>9} {:>15} {:>13} {:>16} {:>12} {:>10}",
            args.kind,
            r.fault,
            c.sections,
            r.injected,
            c.overlaps,
            c.paused_overlaps,
            c.stale_rejected,
            c.fence_violations,
            c.unsignalled,
            unpromised
        );
    }
    if rows
        .iter()
        .any(|r| !(r.promise.exclusion && r.promise.fences))
    {
        crate::output::outln!("UNPROMISED: overlaps/fence violations where the store promises no exclusion/fences under that fault (the fence caught their writes)");
    }
    if let Some(n) = note {
        crate::output::outln!("{n}");
    }
    let mode = plan.mode;
    if mode != Mode::Lock {
        crate::output::outln!("keys: {}", mode.describe());
    }
    crate::output::outln!("seed {seed}");
}
