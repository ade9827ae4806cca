//! The command line, as clap derives it: doc comments are the help text.

use crate::exit::{self, Failure};
use crate::process::signals::SignalArg;
use clap::{Args, Parser, Subcommand, ValueEnum};
use leasehold::queue::worker::WorkerOptions;
use leasehold::{Key, PermitRequest};
use std::ffi::{OsStr, OsString};
use std::time::Duration;

/// Distributed locks and leases: run a command under a lock, inspect and manage leases.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, after_help = exit::HELP)]
pub(crate) struct Cli {
    /// The lock store, e.g. file:///var/lib/leasehold or memory:// [default: file://<state dir>/leasehold/locks]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = leasehold::defaults::STORE_ENV,
        hide_env_values = true
    )]
    pub(crate) store: Option<String>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding the lease on a key (a distributed flock(1)).
    ///
    /// With --permits N the command runs under one permit of the semaphore KEY (at most N such
    /// commands at once, across hosts); with --read or --write under a read or the write permit
    /// of the read-write lock KEY. A permit is held, renewed and lost like the lease, with a
    /// fence of its own.
    ///
    /// The command sees LEASEHOLD_KEY, LEASEHOLD_FENCE (its lease's or permit's fence) and
    /// LEASEHOLD_HOLDER in its environment.
    /// leasehold exits with the command's status. SIGTERM, SIGINT and SIGHUP are forwarded to the
    /// command (not a terminal's Ctrl-C, which the command gets from the terminal); after it exits
    /// (or is killed once --grace has passed) the lease is released. If renewals fail while the
    /// command runs, it gets SIGTERM at the stop-by deadline and SIGKILL after --loss-grace, gone
    /// before the lease could expire; if the store says the lease is gone, SIGKILL at once
    /// (SIGTERM first with --overlap-grace); leasehold then exits 76. A leasehold that is paused
    /// (SIGSTOP) cannot do this: the command's group guard kills it as the lease runs out. The
    /// command and its process group never outlive leasehold, even a leasehold killed with SIGKILL,
    /// and whatever the command left running (a daemon in a new session too) is killed before the
    /// lease is released.
    #[command(after_help = exit::HELP)]
    Run(RunArgs),

    /// Hold the lease on a key while stdin stays open: for a script that runs several commands
    /// under one lease (as a coprocess).
    ///
    /// --permits N, --read and --write hold one permit of a semaphore or read-write lock instead,
    /// as for `run`.
    ///
    /// Once the lease is obtained, prints `held KEY HOLDER FENCE` (--json: an object); then holds
    /// it until stdin reaches end-of-file (closed, or its writer died) or SIGTERM, SIGINT or
    /// SIGHUP, and releases it (exit 0). When renewals fail it prints `stop KEY MS` at the
    /// stop-by deadline: stop what runs under the lease within MS milliseconds, before the lease
    /// could expire. A lost lease prints `lost KEY REASON` and exits 76.
    #[command(after_help = exit::HELP)]
    Hold(HoldArgs),

    /// Elect a leader: campaign for the lease on a key, lead while holding it, campaign again
    /// when it is lost.
    ///
    /// Candidates wait for the lease (registered as its waiter, so a leader stepping down hands
    /// over at once). Without a command, the leader holds the lease until SIGTERM, SIGINT or
    /// SIGHUP (then releases it and exits 0), and events go to stdout, one line each: `elected
    /// KEY HOLDER FENCE` and `lost KEY REASON` (--json: one JSON object per line). With a
    /// command, the leader runs it as `run` does and exits with its status; events go to stderr.
    /// When renewals fail the command is stopped as `run` stops it (SIGTERM at the stop-by
    /// deadline, SIGKILL after --loss-grace, before the lease could expire; SIGKILL at once when
    /// the store says it is gone) and the candidate campaigns again (--once: exits 76); without a
    /// command, `stop KEY MS` is told at the stop-by deadline. A candidate still campaigning
    /// exits 128+S on signal S.
    #[command(after_help = exit::HELP)]
    Elect(ElectArgs),

    /// Follow a key: its state now and at every change, one line each, until interrupted.
    ///
    /// A line is `KEY STATE fence N [holder H] [waiter W]` (STATE: held, expired, free; or `KEY
    /// none`, `KEY corrupt DETAIL`); renewals are not changes. Changes are seen through the
    /// store's notification where it has one, when the lease expires, and at the latest every
    /// --every. On Redis, which notifies only releases someone waits for, each lease seen is
    /// marked `"watched":true` in its record so that its release is notified; a free key taken
    /// is seen within --every. A store that is away (a restart, a failover) is said once on
    /// stderr and looked at again every second (or --every, if shorter) until it answers.
    #[command(after_help = exit::HELP)]
    Watch(WatchArgs),

    /// Measure the store from here: acquire+release cycles per second with N tasks on distinct
    /// keys, and handoffs per second with N tasks taking turns on one key, with latencies.
    ///
    /// Keys are leasehold-bench/PID-MS/…, all released at the end (stores that keep free
    /// records keep these too: `cleanup` removes them).
    #[command(after_help = exit::HELP)]
    Bench(BenchArgs),

    /// List lease records (KEY, HOLDER, FENCE, EXPIRES, WAITER).
    ///
    /// A semaphore or read-write key has a row saying what it is and how many hold it
    /// (`semaphore 3/4 permits held`, `read-write: 2 readers`), then a row per holder.
    #[command(after_help = exit::HELP)]
    Ls(LsArgs),

    /// Show one key's lease record, one field per line.
    ///
    /// A semaphore or read-write key shows what it is (`kind`) and a `holder` line per permit
    /// held (holder, read or write, fence, expiry, pid, host).
    #[command(after_help = exit::HELP)]
    Inspect(InspectArgs),

    /// Free a lease whoever holds it (an operator's action; its holder is told it lost the lease).
    ///
    /// On a semaphore or read-write key it frees every permit; with --holder ID only what ID holds
    /// there (its permits, or the lease if ID holds it).
    #[command(after_help = exit::HELP)]
    Release(ReleaseArgs),

    /// Remove records that are free or expired and untouched for a while (fences stay monotonic).
    #[command(after_help = exit::HELP)]
    Cleanup(CleanupArgs),

    /// The per-key serialised task queue: add tasks, list them, run workers.
    ///
    /// Tasks of one key run one at a time (under the key's lease from --store); workers share
    /// global capacity slots and serve keys fairly. The queue lives in --queue URL
    /// (sqlite:///path/queue.db, the default under the state dir, or postgres://…).
    #[command(after_help = exit::HELP)]
    Queue(QueueArgs),

    /// Serve a web page of the leases and the queue, updated live, with the same data as JSON.
    ///
    /// The page at http://ADDR/ shows the keys under --prefix that are held, expired or waited
    /// for (holder, fence, time left, waiters in line, permits held) and the queue (slots used, pending by priority, running tasks with
    /// their lease), and follows their changes (server-sent events at /events: the store's
    /// notifications where it has them, expiries, and a look at least every --every). It works
    /// without JavaScript too (reload to refresh). /api/leases is `ls --json`, /api/queue is
    /// `queue status --json` (404 while the default queue does not exist). Read-only unless --allow-force-release: then POST /api/release
    /// with {"key": KEY} (and "holder": ID for one holder's permits) and the header
    /// `Authorization: Bearer TOKEN` frees a lease as `release --force` does. The token is read
    /// from --token-file, else made up and printed at start. Prints `serving http://ADDR/` once
    /// listening; runs until SIGTERM, SIGINT or SIGHUP (exit 0).
    #[command(after_help = exit::HELP)]
    Serve(ServeArgs),

    /// Check exclusion and fencing under real faults: client processes take leases on a few keys
    /// and write to a fenced resource (a process of its own) under each, while clients are killed
    /// (SIGKILL) or paused past their TTL (SIGSTOP).
    ///
    /// KIND is the store: file (a temp dir), redis (a private redis-server started here) or
    /// memory (each client on a store of its own: nothing excludes anything, so violations must be
    /// reported); with --store URL, that store (KIND then only names it). Prints, per fault, the
    /// critical sections run, faults injected, overlaps (two clients inside one key at once, the
    /// earlier neither paused nor killed: an exclusion violation), paused overlaps (the earlier one
    /// was paused: no lock can prevent it), requests caught by the fence and fence violations (a
    /// grant whose fence was not above the last). Exits 1 when there was an overlap or a fence
    /// violation. The seed is printed; --seed replays the same fault schedule.
    ///
    /// With --permits N the keys are semaphores (an overlap: more than N clients inside one key)
    /// and with --read-write read-write locks (an overlap: a writer beside anyone); fences must
    /// still rise with every grant.
    #[command(after_help = exit::HELP)]
    Torture(TortureArgs),
}

/// How `run` and `hold` take the lease.
#[derive(Debug, Args)]
pub(crate) struct LeaseArgs {
    /// The key to lock.
    #[arg(long, value_name = "KEY")]
    pub(crate) key: OsString,

    /// Time to live of the lease; it is renewed every TTL/3 while held.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// Wait at most this long for the lease, then exit 75 [default: wait forever].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "no_wait")]
    pub(crate) wait: Option<Duration>,

    /// Do not wait: if the lease is held elsewhere, exit 75 at once.
    #[arg(long)]
    pub(crate) no_wait: bool,

    /// When renewals fail (the store unreachable from here): how long the command has to exit
    /// after SIGTERM before SIGKILL (`hold`: how long before that SIGKILL point its script is
    /// told `stop`). SIGTERM goes at the stop-by deadline, early enough that the command is gone,
    /// SIGKILL included, before the lease could expire and another process be granted it, so
    /// this must fit the TTL (renewed every TTL/3, a drift margin of 1 % + 2 ms, and min(TTL/10,
    /// 1s) for SIGKILL to take effect): a value that does not is a usage error naming the largest
    /// that fits [default: min(TTL/3, (2/3 TTL − drift)/2) less the SIGKILL margin: 455ms at a 2s
    /// TTL, 8.849s at 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) loss_grace: Option<Duration>,

    /// A label stored with the lease (repeatable), e.g. --label task=nightly.
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = parse_label)]
    pub(crate) labels: Vec<(String, String)>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): this process's
    /// lease metrics (leasehold_acquire_*, leasehold_renewals_total, leasehold_lost_total …).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,

    /// Take one permit of the semaphore KEY of N permits (1 to 64) instead of its lock: at most
    /// N holders at once, each with a fence of its own. Every caller of KEY must name the same N.
    #[arg(long, value_name = "N", value_parser = permit_count, conflicts_with_all = ["read", "write"])]
    pub(crate) permits: Option<u32>,

    /// Take a read permit of the read-write lock KEY: shared with other readers, not with a
    /// writer (nor granted while a writer waits ahead of it).
    #[arg(long, conflicts_with = "write")]
    pub(crate) read: bool,

    /// Take the write permit of the read-write lock KEY: alone, no reader beside it.
    #[arg(long)]
    pub(crate) write: bool,
}

impl LeaseArgs {
    /// The permit the flags ask for, `None` for the key's lock.
    pub(crate) fn permit(&self) -> Option<PermitRequest> {
        match (self.permits, self.read, self.write) {
            (Some(permits), _, _) => Some(PermitRequest::Semaphore { permits }),
            (None, true, _) => Some(PermitRequest::Read),
            (None, false, true) => Some(PermitRequest::Write),
            (None, false, false) => None,
        }
    }
}

/// Options of `run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) lease: LeaseArgs,

    /// Send this signal to the command (once) when another process starts waiting for the lease,
    /// e.g. SIGUSR1, USR1, TERM or 10.
    #[arg(long, value_name = "SIGNAL", value_parser = SignalArg::parse)]
    pub(crate) on_handoff: Option<SignalArg>,

    /// The shutdown grace: how long the command may take to exit after a forwarded SIGTERM,
    /// SIGINT or SIGHUP before SIGKILL. The lease is renewed meanwhile; if renewals fail, the
    /// shorter --loss-grace applies from the stop-by deadline.
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_duration)]
    pub(crate) grace: Duration,

    /// When the store says the lease is gone (force-released, taken over, expired), the command
    /// is killed (SIGKILL) at once: another process may hold the lease already. With this, it
    /// gets SIGTERM and this long to exit before SIGKILL instead: an overlap, in which both may
    /// run.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub(crate) overlap_grace: Duration,

    /// The command to run, and its arguments (after `--`).
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true, num_args = 1..)]
    pub(crate) command: Vec<OsString>,
}

/// Options of `hold`.
#[derive(Debug, Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    pub(crate) lease: LeaseArgs,

    /// Print the events as JSON objects, one per line.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `elect`.
#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// The key whose holder is the leader.
    #[arg(long, value_name = "KEY")]
    pub(crate) key: OsString,

    /// Time to live of the lease; it is renewed every TTL/3 while leading. A leader that dies
    /// without releasing is replaced after the TTL.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// Exit 76 when the lease is lost instead of campaigning again.
    #[arg(long)]
    pub(crate) once: bool,

    /// Print events as JSON objects, one per line (without a command).
    #[arg(long)]
    pub(crate) json: bool,

    /// The shutdown grace: how long the command may take to exit after a forwarded SIGTERM,
    /// SIGINT or SIGHUP before SIGKILL. The lease is renewed meanwhile; if renewals fail, the
    /// shorter --loss-grace applies from the stop-by deadline.
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_duration)]
    pub(crate) grace: Duration,

    /// When renewals fail (the store unreachable from here): how long the command has to exit
    /// after SIGTERM before SIGKILL (`hold`: how long before that SIGKILL point its script is
    /// told `stop`). SIGTERM goes at the stop-by deadline, early enough that the command is gone,
    /// SIGKILL included, before the lease could expire and another process be granted it, so
    /// this must fit the TTL (renewed every TTL/3, a drift margin of 1 % + 2 ms, and min(TTL/10,
    /// 1s) for SIGKILL to take effect): a value that does not is a usage error naming the largest
    /// that fits [default: min(TTL/3, (2/3 TTL − drift)/2) less the SIGKILL margin: 455ms at a 2s
    /// TTL, 8.849s at 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) loss_grace: Option<Duration>,

    /// When the store says the lease is gone (force-released, taken over, expired), the command
    /// is killed (SIGKILL) at once: another process may hold the lease already. With this, it
    /// gets SIGTERM and this long to exit before SIGKILL instead: an overlap, in which both may
    /// run.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub(crate) overlap_grace: Duration,

    /// A label stored with the lease (repeatable), e.g. --label pod=web-1.
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = parse_label)]
    pub(crate) labels: Vec<(String, String)>,

    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): leasehold_leader
    /// (1 while this candidate leads, else 0) and its lease metrics (leasehold_acquire_*,
    /// leasehold_lost_total …).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,

    /// The command the leader runs, and its arguments (after `--`); none: just hold the lease.
    #[arg(value_name = "CMD", trailing_var_arg = true)]
    pub(crate) command: Vec<OsString>,
}

/// Options of `ls`.
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// Only keys starting with this prefix.
    #[arg(long, value_name = "PREFIX")]
    pub(crate) prefix: Option<OsString>,

    /// Print a JSON array of records instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `inspect`.
#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The key.
    #[arg(value_name = "KEY")]
    pub(crate) key: OsString,

    /// Print the record as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A fault of `torture --faults`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Fault {
    /// No fault.
    None,
    /// SIGKILL of a client.
    Kill,
    /// SIGSTOP of a client past its TTL, then SIGCONT.
    Stop,
    /// The store's servers restarted (or failed over).
    Restart,
    /// The store cut off by TCP proxies.
    Partition,
    /// The store's answers to a client lost (its requests applied), its connections reset, and
    /// the client then cut off.
    LostAnswer,
    /// Clients whose wall clocks are off.
    Clock,
}

impl Fault {
    /// Its name on the command line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Restart => "restart",
            Fault::Partition => "partition",
            Fault::LostAnswer => "lost-answer",
            Fault::Clock => "clock",
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How `torture`'s clients take their leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Via {
    /// Through the library, checking the guard before each write.
    #[value(name = "lib")]
    Library,
    /// Through `leasehold run`, the writes made by its command (`leasehold __torture section`).
    Run,
}

impl Via {
    /// Its name on the command line (`lib`, `run`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Via::Library => "lib",
            Via::Run => "run",
        }
    }

    /// `lib` or `run`.
    pub(crate) fn parse(s: &str) -> Option<Via> {
        <Via as ValueEnum>::from_str(s, false).ok()
    }
}

/// A queued task's policy (`queue add --policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyArg {
    /// Never run twice: a task whose worker died is marked failed.
    AtMostOnce,
    /// Run again (up to --max-attempts) when its worker died.
    AtLeastOnce,
}

/// Options of `torture`.
#[derive(Debug, Args)]
pub(crate) struct TortureArgs {
    /// The store, its servers started here: file, memory, redis, redis-sentinel, redis-cluster,
    /// redlock, etcd, postgres, k8s, gcs, s3, azure; or a name for the --store URL given.
    #[arg(default_value = "file")]
    pub(crate) kind: String,

    /// How long to run, shared between the faults.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    pub(crate) duration: Duration,

    /// The seed of the fault schedule and of the clients' choices (default: random, printed).
    #[arg(long)]
    pub(crate) seed: Option<u64>,

    /// How many client processes.
    #[arg(long, default_value_t = 5)]
    pub(crate) clients: usize,

    /// How many keys they share.
    #[arg(long, default_value_t = 3)]
    pub(crate) keys: usize,

    /// The faults, one phase each: none, kill, stop, restart (of the store's servers started
    /// here), partition (the store cut off from a client or from all by TCP proxies: latency,
    /// black hole, resets; on etcd started here also a member from its peers), lost-answer (the
    /// store's answers to clients lost while their requests are applied, their connections
    /// reset, then one of them cut off), clock (clients whose wall clock is minutes off, an hour
    /// on the object stores) (comma-separated).
    #[arg(
        long,
        value_name = "FAULT,…",
        value_delimiter = ',',
        default_value = "none,kill,stop"
    )]
    pub(crate) faults: Vec<Fault>,

    /// The clients' lease TTL.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// How clients take their leases: lib (the library, checking the guard before each write),
    /// run (`leasehold run`, its command writing), or both (comma-separated; clients take turns).
    #[arg(
        long,
        value_name = "VIA,…",
        value_delimiter = ',',
        default_value = "lib,run"
    )]
    pub(crate) via: Vec<Via>,

    /// Write the resource's history to FILE: each request, when it was received (CLOCK_MONOTONIC
    /// ns), on which connection, and its answer.
    #[arg(long, value_name = "FILE")]
    pub(crate) history: Option<std::path::PathBuf>,

    /// Print the table as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,

    /// The keys are semaphores of N permits (1 to 64, fewer than --clients): an overlap is a
    /// client entering a key while N others, neither paused nor killed, are inside it. The limit
    /// is tested only while more than N clients want one key: use few --keys.
    #[arg(long, value_name = "N", value_parser = permit_count, conflicts_with = "read_write")]
    pub(crate) permits: Option<u32>,

    /// The keys are read-write locks, clients reading and writing (one time in three): an
    /// overlap is a writer beside anyone, or a reader beside a writer.
    #[arg(long)]
    pub(crate) read_write: bool,
}

/// Options of `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Listen on this IP address and port (port 0: any free port, printed at start).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7474")]
    pub(crate) listen: std::net::SocketAddr,

    /// The queue to show: sqlite:///path/queue.db or postgres://user@host:port/db [default: sqlite://<state dir>/leasehold/queue.db, shown once it exists: serve does not create it]
    #[arg(
        long,
        value_name = "URL",
        env = leasehold::defaults::QUEUE_ENV,
        hide_env_values = true
    )]
    pub(crate) queue: Option<String>,

    /// Show only the keys that start with this.
    #[arg(long, value_name = "PREFIX")]
    pub(crate) prefix: Option<OsString>,

    /// Look at the store and the queue at least this often (keys taken under the prefix are
    /// seen within this on a store that notifies only releases, or nothing).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub(crate) every: Duration,

    /// Let the page and POST /api/release free a lease whoever holds it, with the token.
    #[arg(long)]
    pub(crate) allow_force_release: bool,

    /// The force-release token: this file's content (its first line) [default: made up and
    /// printed at start].
    #[arg(long, value_name = "FILE", requires = "allow_force_release")]
    pub(crate) token_file: Option<std::path::PathBuf>,

    /// A host name the page may be reached by (repeatable), beside IP addresses and `localhost`:
    /// a request naming another host is refused (403), so that a web page elsewhere cannot read
    /// the leases through a DNS name pointed at this machine (DNS rebinding).
    #[arg(long, value_name = "NAME")]
    pub(crate) allow_host: Vec<String>,
}

/// Options of `bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// How many concurrent tasks, one run each (comma-separated).
    #[arg(
        long,
        value_name = "N,…",
        value_delimiter = ',',
        default_value = "1,8,64"
    )]
    pub(crate) tasks: Vec<usize>,

    /// How long each run lasts.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub(crate) duration: Duration,

    /// Skip the hot-key runs (all tasks on one key).
    #[arg(long)]
    pub(crate) no_hot: bool,

    /// Print the figures as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,

    /// Also draw the runs into this SVG file: the distribution of the waits for the hot key per
    /// number of tasks, and the rates against the number of tasks.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<std::path::PathBuf>,

    /// Also measure the store's floor beside every row: the cheapest correct raw operations on
    /// this store (Redis: INCR + SET NX PX in one script, compare-and-delete; PostgreSQL: a
    /// fenced upsert of the store's row; etcd: a create-if-absent txn, delete; Kubernetes: a
    /// Lease create, delete; object stores: a conditional create, delete, and on the hot key a
    /// read first; file: open(O_CREAT|O_EXCL), unlink) with the same tasks for as long, through
    /// the store's own connection. Adds the floor's per-second figure and RATIO = leasehold's /
    /// the floor's, and, where the store counts its requests (object stores), requests per cycle
    /// or handoff. A store without a floor says so and measures nothing.
    #[arg(long)]
    pub(crate) floor: bool,
}

/// Options of `watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// The key.
    #[arg(value_name = "KEY")]
    pub(crate) key: OsString,

    /// Print each state as a JSON object on one line (the record as `inspect --json` shows it).
    #[arg(long)]
    pub(crate) json: bool,

    /// Look at the record at least this often.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub(crate) every: Duration,
}

/// Options of `release`.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// Required: only the holder releases a lease (its `leasehold run` does when the command
    /// exits); --force frees it whoever holds it.
    #[arg(long)]
    pub(crate) force: bool,

    /// Free only what this holder (its id, as `inspect` shows it) holds on the key: its permits
    /// of a semaphore or read-write key, or the lease if it holds it; nobody else's.
    #[arg(long, value_name = "ID")]
    pub(crate) holder: Option<String>,

    /// The key.
    #[arg(value_name = "KEY")]
    pub(crate) key: OsString,
}

/// Options of `cleanup`.
#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// Remove records free (or expired) for at least this long.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub(crate) older_than: Duration,
}

/// Options of `queue`.
#[derive(Debug, Args)]
pub(crate) struct QueueArgs {
    /// The queue: sqlite:///path/queue.db or postgres://user@host:port/db [default: sqlite://<state dir>/leasehold/queue.db]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = leasehold::defaults::QUEUE_ENV,
        hide_env_values = true
    )]
    pub(crate) queue: Option<String>,

    #[command(subcommand)]
    pub(crate) command: QueueCommand,
}

/// The `queue` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Add a task: a command to run under the key's lease. Prints its id and its position in the
    /// key's line.
    Add(QueueAddArgs),
    /// List pending and running tasks (ID, KEY, GROUP, PRIORITY, STATE, ATTEMPTS, WORKER, COMMAND).
    Ls(QueueLsArgs),
    /// Pending by priority, running with slots used/max, by group, by key, the key leases.
    Status(QueueStatusArgs),
    /// Cancel a task: a pending one at once, a running one through its worker (SIGTERM, then
    /// SIGKILL after the worker's --grace).
    Cancel(QueueCancelArgs),
    /// Delete tasks that ended (succeeded, failed, cancelled) at least --older-than ago; pending
    /// and running tasks are never touched. Prints how many were deleted.
    Cleanup(QueueCleanupArgs),
    /// Run tasks: claim them, take each key's lease, run the command with LEASEHOLD_TASK_ID,
    /// LEASEHOLD_KEY, LEASEHOLD_FENCE and LEASEHOLD_HOLDER in its environment, renew while it
    /// runs, release when it ends. Whatever a task leaves running (a daemon in a new session
    /// too) is killed when it ends, before the lease is released. SIGTERM or SIGINT drains: no
    /// new tasks, running ones may finish until --drain-timeout, then they are stopped.
    Work(QueueWorkArgs),
}

/// Options of `queue add`.
#[derive(Debug, Args)]
pub(crate) struct QueueAddArgs {
    /// The key whose tasks run one at a time (e.g. a user).
    #[arg(long, value_name = "KEY")]
    pub(crate) key: String,

    /// The accounting group (e.g. a project), for per-group limits and status.
    #[arg(long, value_name = "GROUP")]
    pub(crate) group: Option<String>,

    /// high, normal or low.
    #[arg(long, value_name = "PRIORITY", default_value = "normal", value_parser = parse_priority)]
    pub(crate) priority: leasehold::queue::Priority,

    /// The longest the task may run; its worker stops it after that (task cancelled).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,

    /// If its worker dies mid-task: at-most-once (the task fails, never runs twice) or
    /// at-least-once (it runs again, up to --max-attempts).
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = PolicyArg::AtMostOnce)]
    pub(crate) policy: PolicyArg,

    /// Attempts in all under at-least-once.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,

    /// Print {"id":…,"position":…} instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,

    /// The command to run, and its arguments (after `--`).
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true, num_args = 1..)]
    pub(crate) command: Vec<OsString>,
}

/// Options of `queue ls`.
#[derive(Debug, Args)]
pub(crate) struct QueueLsArgs {
    /// Ended tasks too.
    #[arg(long)]
    pub(crate) all: bool,

    /// At most this many tasks.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) limit: u64,

    /// Print a JSON array of tasks instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `queue status`.
#[derive(Debug, Args)]
pub(crate) struct QueueStatusArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `queue cancel`.
#[derive(Debug, Args)]
pub(crate) struct QueueCancelArgs {
    /// The task id.
    #[arg(value_name = "ID")]
    pub(crate) id: u64,
}

/// Options of `queue cleanup`.
#[derive(Debug, Args)]
pub(crate) struct QueueCleanupArgs {
    /// Delete tasks that ended at least this long ago (by the queue's clock).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_duration)]
    pub(crate) older_than: Duration,

    /// Print JSON (`{"deleted": N}`).
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `queue work`.
#[derive(Debug, Args)]
pub(crate) struct QueueWorkArgs {
    /// Global capacity: no task is started while this many run in the whole queue (this worker
    /// also runs at most this many).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) slots: u32,

    /// At most this many running tasks per group.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) group_limit: Option<u32>,

    /// TTL of the key leases and of this worker's claims; both are renewed every TTL/3. A killed
    /// worker's tasks are recovered after it.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// How long a task may wait for its key's lease (held by a dead worker until its TTL) before
    /// it goes back to the queue [default: 2 × TTL].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) lease_wait: Option<Duration>,

    /// How long a task stopped by cancel, timeout or drain may take to exit after SIGTERM before
    /// SIGKILL (a task stopped for its key's lease gets until the lease's deadline).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub(crate) grace: Duration,

    /// After SIGTERM/SIGINT, how long running tasks may still finish before they are stopped.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub(crate) drain_timeout: Duration,

    /// A pending task gains one priority level per this much waiting (low never starves).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub(crate) aging: Duration,

    /// Exit once the whole queue has nothing pending or running.
    #[arg(long)]
    pub(crate) exit_when_idle: bool,

    /// Delete tasks that ended at least this long ago, as `queue cleanup --older-than` does: at
    /// start, then every hour (or every DURATION if shorter, at least a second apart), beside
    /// the work. Off unless given.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) cleanup_after: Option<Duration>,

    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): the queue's depth,
    /// running tasks and slots (read at each scrape), this worker's started and finished tasks,
    /// their wait and run times, and its leases (leasehold_acquire_*, leasehold_lost_total …).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

impl QueueWorkArgs {
    /// The library's worker options these flags give, with `stop_grace` (the process runner's
    /// own bound on stopping a task, which `--grace` is part of).
    pub(crate) fn worker_options(&self, stop_grace: Duration) -> WorkerOptions {
        let mut o = WorkerOptions::default();
        o.slots = self.slots;
        o.group_limit = self.group_limit;
        o.ttl = self.ttl;
        o.lease_wait = self.lease_wait;
        o.aging = self.aging;
        o.drain_timeout = self.drain_timeout;
        o.stop_grace = stop_grace;
        o.cleanup_after = self.cleanup_after;
        o.exit_when_idle = self.exit_when_idle;
        o
    }
}

/// A key from the command line (UTF-8, 1–1024 bytes, no control characters).
pub(crate) fn key_arg(arg: &OsStr) -> Result<Key, Failure> {
    Ok(Key::from_os_str(arg)?)
}

/// The `--prefix` of `ls` (UTF-8; empty lists everything).
pub(crate) fn prefix_arg(arg: Option<&OsStr>) -> Result<String, Failure> {
    match arg {
        None => Ok(String::new()),
        Some(p) => p.to_str().map(str::to_owned).ok_or_else(|| {
            Failure::usage(format!(
                "invalid prefix {:?}: not valid UTF-8",
                p.to_string_lossy()
            ))
        }),
    }
}

/// Parses a priority.
fn parse_priority(s: &str) -> Result<leasehold::queue::Priority, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not a priority (use high, normal or low)"))
}

/// Parses `500ms`, `30s`, `2m`, `1h`, `1h 30m` …
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    // Deadlines are the monotonic clock plus a duration: keep them representable. A year is
    // humantime's (365.25 days), as for the store URLs' durations: `100y` is the longest.
    const LONGEST: Duration = Duration::from_secs(100 * 31_557_600);
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (examples: 500ms, 30s, 2m, 1h)"))?;
    if d > LONGEST {
        return Err(format!("{s:?} is longer than 100 years"));
    }
    Ok(d)
}

/// Parses a permit count: 1 to [`leasehold::PERMIT_LIMIT`].
fn permit_count(s: &str) -> Result<u32, String> {
    let limit = leasehold::PERMIT_LIMIT;
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=limit).contains(&n) => Ok(n),
        _ => Err(format!("a semaphore has 1 to {limit} permits, not {s:?}")),
    }
}

/// Parses `name=value`.
fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err("expected NAME=VALUE with a non-empty NAME".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn queue_work_defaults_are_the_librarys() {
        let cli = Cli::try_parse_from(["leasehold", "queue", "work"]).unwrap();
        let Command::Queue(QueueArgs {
            command: QueueCommand::Work(args),
            ..
        }) = cli.command
        else {
            panic!("not queue work")
        };
        let library = WorkerOptions::default();
        assert_eq!(args.worker_options(library.stop_grace), library);
    }

    #[test]
    fn durations_and_labels_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("500000000000y")
            .unwrap_err()
            .contains("100 years"));
        assert!(parse_duration("5x").is_err());
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_label("=b").is_err());
        assert!(parse_label("ab").is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2_000))]

        /// Any text is a duration of at most 100 years (what a deadline can add) or a message;
        /// a duration written back reads as itself.
        #[test]
        fn any_text_is_a_duration_or_a_message(
            s in ".{0,30}|[0-9]{1,25} ?[a-z]{0,7}( [0-9]{1,6}[a-z]{1,3}){0,3}",
        ) {
            match parse_duration(&s) {
                Ok(d) => {
                    proptest::prop_assert!(d <= Duration::from_secs(100 * 31_557_600));
                    let written = humantime::format_duration(d).to_string();
                    proptest::prop_assert_eq!(parse_duration(&written), Ok(d));
                }
                Err(e) => proptest::prop_assert!(!e.is_empty()),
            }
        }

        /// Labels, priorities and signals: a value or a message, never a panic.
        #[test]
        fn any_text_is_a_label_priority_signal_or_a_message(s in ".{0,30}") {
            if let Ok((name, value)) = parse_label(&s) {
                proptest::prop_assert_eq!(format!("{name}={value}"), s.clone());
            }
            let _ = parse_priority(&s);
            if let Ok(sig) = crate::process::signals::SignalArg::parse(&s) {
                proptest::prop_assert!((1..=64).contains(&sig.0));
            }
        }
    }
}
