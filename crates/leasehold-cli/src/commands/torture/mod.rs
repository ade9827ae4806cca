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
//! not promise exclusion or fences under a fault ([`servers::promises`]: a Redis server restarted
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

/// Runs the harness (see the module documentation).
pub(crate) async fn torture(url: Option<&str>, args: TortureArgs) -> Result<u8, Failure> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    if args.clients == 0 || args.keys == 0 || args.ttl < Duration::from_millis(100) {
        return Err(Failure::new(
            USAGE,
            "--clients and --keys must be at least 1, --ttl at least 100ms",
        ));
    }
    match Mode::of(&args) {
        Mode::Semaphore(n) if usize::try_from(n).map_or(true, |n| n >= args.clients) => {
            return Err(Failure::new(
                USAGE,
                format!(
                    "--permits {n} needs more --clients than permits (now {}): with no more clients than permits, none is ever refused and nothing is checked",
                    args.clients
                ),
            ));
        }
        Mode::ReadWrite if args.clients < 2 => {
            return Err(Failure::new(
                USAGE,
                "--read-write needs at least 2 --clients: one alone never meets another",
            ));
        }
        _ => {}
    }
    crate::output::errln!(
        "leasehold torture: seed {seed} (--seed {seed} replays this fault schedule)"
    );
    let note = servers::note(&args.kind, url);
    if let Some(n) = note {
        crate::output::errln!("leasehold torture: {n}");
    }
    let dir = std::env::temp_dir().join(format!("leasehold-torture-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::new(ERROR, format!("{}: {e}", dir.display())))?;
    let outcome = harness(url, &args, seed, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = outcome?;
    let broken = rows
        .iter()
        .any(|r| r.counts.overlaps > 0 || r.counts.fence_violations > 0);
    print_rows(&args, seed, &rows, note);
    // A run in which no client ever entered checked nothing (a store it cannot use, say).
    let idle = rows.iter().all(|r| r.counts.sections == 0);
    if idle {
        crate::output::errln!(
            "leasehold torture: no client entered a critical section: nothing was checked"
        );
    }
    Ok(if broken || idle { ERROR } else { OK })
}

async fn harness(
    url: Option<&str>,
    args: &TortureArgs,
    seed: u64,
    dir: &Path,
) -> Result<Vec<Row>, Failure> {
    let partition = args.faults.contains(&Fault::Partition);
    let stores = Stores::start(&args.kind, url, dir, partition).await?;
    if args.faults.contains(&Fault::Restart) && !stores.restartable() {
        return Err(Failure::new(
            USAGE,
            format!(
                "the restart fault needs a server started here (not --store URL, not {})",
                args.kind
            ),
        ));
    }
    let store = stores.url().to_owned();
    // Opened once, as a client would (its environment), before any client starts: a store that
    // cannot be opened is said once.
    let opened =
        Command::new(std::env::current_exe().map_err(|e| {
            Failure::new(ERROR, format!("cannot find the leasehold executable: {e}"))
        })?)
        .args([ARG, "open", &store, &Mode::of(args).arg()])
        .envs(stores.env().iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| Failure::new(ERROR, format!("cannot start a torture process: {e}")))?;
    if !opened.status.success() {
        let why = String::from_utf8_lossy(&opened.stderr);
        let why = why.trim().trim_start_matches("leasehold: torture: ");
        stores.stop();
        return Err(Failure::new(USAGE, format!("cannot open the store: {why}")));
    }
    let said = String::from_utf8_lossy(&opened.stdout);
    let expiry_clock = clock::from_word(said.trim()).ok_or_else(|| {
        Failure::new(
            ERROR,
            format!("opening the store said {said:?} for its expiry clock"),
        )
    })?;
    let mut servers: Vec<Child> = vec![];
    let socket = dir.join("resource.sock");
    let mut resource_args = vec![
        "resource".to_owned(),
        socket.display().to_string(),
        Mode::of(args).arg(),
    ];
    if let Some(h) = &args.history {
        resource_args.push(h.display().to_string());
    }
    let resource_args: Vec<&str> = resource_args.iter().map(String::as_str).collect();
    servers.push(spawn_self(&resource_args, &[])?);
    let resource = connect_resource(&socket).await?;
    let share = args.duration / u32::try_from(args.faults.len().max(1)).unwrap_or(1);
    let mut rows = vec![];
    let mut fences_lost = false;
    let mut run = Run {
        args,
        store,
        expiry_clock,
        stores,
        socket,
        resource,
    };
    for (n, &fault) in args.faults.iter().enumerate() {
        let phase_seed = seed.wrapping_add(1_000_003 * n as u64);
        let mut promise = servers::promises(&args.kind, fault);
        promise.fences &= !fences_lost;
        fences_lost |= !promise.fences;
        rows.push(run.phase(fault, promise, share, phase_seed).await?);
    }
    for mut s in servers {
        let _ = s.start_kill();
        let _ = s.wait().await;
    }
    run.stores.stop();
    Ok(rows)
}

/// What every phase of one run shares: its options, the store (its URL and its servers), and
/// the resource the clients write to.
struct Run<'a> {
    args: &'a TortureArgs,
    store: String,
    /// Whose clock judges the store's expiry (as the store said when opened).
    expiry_clock: leasehold::ExpiryClock,
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
        let args: &TortureArgs = self.args;
        let store: &str = &self.store;
        let socket: &Path = &self.socket;
        let stores = &mut self.stores;
        let resource = &mut self.resource;
        let mut rng = fastrand::Rng::with_seed(seed);
        // partition, lost-answer: each client reaches the store through proxies of its own.
        // lost-answer: the clients' store calls time out after 2/5 of the TTL unless the URL
        // says otherwise, so that a call whose answer is lost is sent again within the lease's
        // life; and their critical sections last a TTL, so that a holder cut off is still inside
        // when its lease could expire.
        let mut routes = vec![];
        let mut timeout = Duration::ZERO;
        let mut hold = Duration::ZERO;
        if matches!(fault, Fault::Partition | Fault::LostAnswer) {
            let url = if fault == Fault::LostAnswer {
                let (url, t) = network::with_timeout(store, args.ttl * 2 / 5)
                    .map_err(|e| Failure::new(USAGE, format!("{fault}: {e}")))?;
                if t >= args.ttl {
                    crate::output::errln!(
                        "leasehold torture: {fault}: the store's timeout ({}) is not below the TTL ({}): a call whose answer is lost is sent again after the lease could expire, and the fault shows nothing",
                        crate::output::duration(t),
                        crate::output::duration(args.ttl)
                    );
                }
                timeout = t;
                hold = args.ttl;
                url
            } else {
                store.to_owned()
            };
            for _ in 0..args.clients {
                routes.push(
                    network::Route::new(&url, fault.as_str())
                        .await
                        .map_err(|e| Failure::new(USAGE, e))?,
                );
            }
        }
        // clock: a seeded half of the clients starts with a skewed wall clock, and each injection
        // replaces a client with a skewed one, ahead and behind in turn.
        let mut skews = 0;
        let given = clock::skews(self.expiry_clock);
        let mut skew = |rng: &mut fastrand::Rng, always: bool| {
            (fault == Fault::Clock && (always || rng.bool())).then(|| {
                skews += 1;
                given[skews % 2]
            })
        };
        if fault == Fault::Clock {
            for s in given {
                clock::check(s).await?;
            }
        }
        let store_env = stores.env().to_vec();
        let mode = Mode::of(args).arg();
        let spawn =
            |i: usize, generation: u32, skew: Option<&str>| -> Result<(String, Child), Failure> {
                let id = format!("{fault}-c{i}g{generation}");
                let mut env = store_env.clone();
                for (k, v) in skew.map(clock::env).transpose()?.unwrap_or_default() {
                    env.push((k.to_owned(), v));
                }
                let child = spawn_self(
                    &[
                        "client",
                        routes.get(i).map_or(store, |r| r.url.as_str()),
                        &socket.display().to_string(),
                        &id,
                        &args.keys.to_string(),
                        &args.ttl.as_millis().to_string(),
                        &seed
                            .wrapping_add(i as u64 * 7919 + u64::from(generation))
                            .to_string(),
                        args.via[i % args.via.len()].as_str(),
                        &mode,
                        &hold.as_millis().to_string(),
                    ],
                    &env,
                )?;
                Ok((id, child))
            };
        let mut clients = vec![];
        let mut injected = 0;
        for i in 0..args.clients {
            let skewed = skew(&mut rng, false);
            injected += u64::from(skewed.is_some());
            clients.push(spawn(i, 0, skewed)?);
        }
        let mut generation = 1;
        // lost-answer: the injections after which a client was cut off.
        let mut cut_off = 0u64;
        // partition: the cuts of each member of a cluster started here from its peers.
        let mut member_cuts = vec![0u64; stores.peers().map_or(0, |p| p.members())];
        let start = Instant::now();
        let end = start + duration;
        // On a terminal (and not with --json), a bar that tells how the phase goes.
        let bar = crate::progress::bar(
            duration.as_secs(),
            "{prefix:>12} [{bar:30}] {pos}/{len}s  {msg}",
            !args.json,
        );
        bar.set_prefix(fault.as_str());
        let mut shown: Option<Instant> = None;
        while Instant::now() < end {
            if !bar.is_hidden() && shown.is_none_or(|s| s.elapsed() >= Duration::from_secs(1)) {
                shown = Some(Instant::now());
                bar.set_position(start.elapsed().as_secs());
                bar.set_message(progress_message(resource, injected)?);
            }
            // Between half a TTL and one and a half.
            let next = Instant::now() + args.ttl.mul_f64(0.5 + rng.f64());
            tokio::time::sleep_until(next.min(end)).await;
            if Instant::now() >= end {
                break;
            }
            let i = rng.usize(..clients.len());
            let pid = clients[i].1.id();
            match (fault, pid) {
                (Fault::Kill, Some(_)) => {
                    let (id, child) = &mut clients[i];
                    kill_client(resource, id, child).await?;
                    clients[i] = spawn(i, generation, None)?;
                    generation += 1;
                    injected += 1;
                }
                (Fault::Partition, _) => {
                    let peers = stores.peers();
                    let members = peers.map_or(0, |p| p.members());
                    let cut = network::Cut::pick(&mut rng, routes.len(), members, args.ttl);
                    if let network::Whom::Member(m) = cut.whom {
                        if let Some(n) = member_cuts.get_mut(m) {
                            *n += 1;
                        }
                    }
                    cut.apply(&routes, peers).await;
                    injected += 1;
                }
                (Fault::LostAnswer, _) => {
                    let ids: Vec<&str> = clients.iter().map(|(id, _)| id.as_str()).collect();
                    let lost =
                        lose_answers(resource, &routes, &ids, &mut rng, timeout, args.ttl).await?;
                    cut_off += u64::from(lost);
                    injected += 1;
                }
                (Fault::Clock, Some(_)) => {
                    let (id, child) = &mut clients[i];
                    kill_client(resource, id, child).await?;
                    clients[i] = spawn(i, generation, skew(&mut rng, true))?;
                    generation += 1;
                    injected += 1;
                }
                (Fault::Stop, Some(pid)) => {
                    ask(resource, &format!("S {}", clients[i].0))?;
                    signal_group(pid, libc::SIGSTOP);
                    tokio::time::sleep(args.ttl * 3 / 2).await;
                    signal_group(pid, libc::SIGCONT);
                    injected += 1;
                }
                (Fault::Restart, _) => {
                    stores.restart(&mut rng, args.ttl).await?;
                    injected += 1;
                }
                _ => {}
            }
        }
        bar.finish_and_clear();
        if fault == Fault::Partition && !member_cuts.is_empty() {
            let of_members: u64 = member_cuts.iter().sum();
            let each: Vec<String> = member_cuts
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
        if fault == Fault::LostAnswer {
            crate::output::errln!(
                "leasehold torture: lost-answer: after {cut_off} of {injected} injections a client whose answers were lost entered a critical section, and was cut off"
            );
        }
        for (id, mut child) in clients {
            kill_client(resource, &id, &mut child).await?;
        }
        drop(routes);
        let answer = ask(resource, "Q")?;
        let mut counts: Counts = serde_json::from_str(&answer)
            .ok()
            .and_then(|v| Counts::from_json(&v))
            .ok_or_else(|| {
                Failure::new(ERROR, format!("the fenced resource answered {answer:?}"))
            })?;
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

fn print_rows(args: &TortureArgs, seed: u64, rows: &[Row], note: Option<&str>) {
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
                v["mode"] = Mode::of(args).arg().into();
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
    let mode = Mode::of(args);
    if mode != Mode::Lock {
        crate::output::outln!("keys: {}", mode.describe());
    }
    crate::output::outln!("seed {seed}");
}
