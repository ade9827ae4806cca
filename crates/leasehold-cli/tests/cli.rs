//! End-to-end tests of the `leasehold` binary: real processes and signals against a `file://`
//! store in a temp directory, no mocks.
//!
//! Children signal readiness by printing `ready` (read from leasehold's stdout, which they
//! inherit) and are told to finish by closing their stdin or by a signal, so no test sleeps to
//! wait for something it can observe.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// The longest any single step may take before the test fails (not a sleep: an upper bound).
const LIMIT: Duration = Duration::from_secs(20);

/// A child that prints `ready`, then waits for SIGTERM, which it reports and answers with exit 3.
///
/// It waits in `wait`, which a trapped signal interrupts without a race (a signal that comes just
/// before a blocking `read` would wait for the read to end). The short `sleep`s have their own
/// stdio, so none can keep our pipes open, and one outlives the shell by 0.1 s at most.
const TRAP_TERM: &str = "trap 'echo got-TERM; exit 3' TERM; echo ready; \
    while :; do sleep 0.1 </dev/null >/dev/null 2>&1 & wait $!; done";

/// A child that prints `ready`, then waits for SIGUSR1, touches `$MARKER` and exits 0.
const TRAP_USR1: &str = r#"trap 'touch "$MARKER"; echo got-USR1; exit 0' USR1; echo ready;
    while :; do sleep 0.1 </dev/null >/dev/null 2>&1 & wait $!; done"#;

/// A child that prints `ready` and holds on until its stdin closes.
const UNTIL_EOF: &str = "echo ready; read x; exit 0";

/// A file store in a temp directory.
struct Store {
    dir: tempfile::TempDir,
    url: String,
}

impl Store {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("locks").display());
        Store { dir, url }
    }

    /// A scratch directory beside the store at `url`.
    fn at(url: String) -> Self {
        Store {
            dir: tempfile::tempdir().unwrap(),
            url,
        }
    }

    /// The store directory (created by the first command that opens the store).
    fn locks(&self) -> PathBuf {
        self.dir.path().join("locks")
    }

    /// A path in the scratch directory next to the store.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `leasehold --store URL ARGS…`.
    fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = bare();
        c.arg("--store").arg(&self.url).args(args);
        c.current_dir(self.dir.path());
        c
    }

    fn spawn<I, S>(&self, args: I) -> Proc
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Proc::spawn(self.cmd(args))
    }

    fn output<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Proc::spawn(self.cmd(args)).finish(LIMIT)
    }

    /// `inspect KEY --json`, which must succeed.
    fn inspect(&self, key: &str) -> Value {
        let out = self.output(["inspect", key, "--json"]);
        assert_eq!(out.code, Some(0), "inspect {key}: {out:?}");
        serde_json::from_str(&out.stdout).unwrap()
    }

    /// `ls --json [--prefix P]`.
    fn ls_json(&self, prefix: Option<&str>) -> Vec<Value> {
        let mut args = vec!["ls", "--json"];
        if let Some(p) = prefix {
            args.extend(["--prefix", p]);
        }
        let out = self.output(args);
        assert_eq!(out.code, Some(0), "{out:?}");
        serde_json::from_str::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }
}

/// The binary without a store option, with a clean environment for what it reads.
fn bare() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("LEASEHOLD_STORE").env_remove("LEASEHOLD_LOG");
    c
}

/// What a finished process left.
#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Out {
    /// The one line on stderr (fails if there are more or none).
    fn one_stderr_line(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "exactly one line on stderr: {self:?}");
        assert!(lines[0].starts_with("leasehold: "), "{self:?}");
        lines[0]
    }
}

/// A running process whose stdout lines, stderr and exit status are collected by threads.
struct Proc {
    pid: i32,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
    exit: Receiver<ExitStatus>,
    done: bool,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let pid = i32::try_from(child.id()).unwrap();
        let stdin = child.stdin.take();
        let (etx, exit) = mpsc::channel();
        std::thread::spawn(move || {
            let status = child.wait().unwrap();
            let _ = etx.send(status);
        });
        Proc {
            pid,
            stdin,
            lines,
            seen: vec![],
            stderr: Some(stderr),
            exit,
            done: false,
        }
    }

    /// Waits for the stdout line `want`.
    fn wait_line(&mut self, want: &str) {
        self.wait_for_line(want, |line| line == want);
    }

    /// Waits for a stdout line starting with `prefix`; returns it.
    fn wait_line_starting(&mut self, prefix: &str) -> String {
        self.wait_for_line(prefix, |line| line.starts_with(prefix))
    }

    /// Waits for a stdout line that is `wanted` (described as `want`); returns it.
    fn wait_for_line(&mut self, want: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + LIMIT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let hit = wanted(&line);
                    self.seen.push(line.clone());
                    if hit {
                        return line;
                    }
                }
                Err(e) => {
                    let status = self.exit.recv_timeout(Duration::from_secs(1)).ok();
                    self.done |= status.is_some();
                    let stderr = if status.is_some() {
                        self.stderr.take().map(|h| h.join().unwrap())
                    } else {
                        None
                    };
                    panic!(
                        "no line {want:?} ({e:?}); stdout so far {:?}, exit {status:?}, stderr {stderr:?}",
                        self.seen
                    );
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        assert!(!self.done);
        // SAFETY: kill(2) on our own child, which is not reaped yet (its exit was not received).
        assert_eq!(unsafe { libc::kill(self.pid, sig) }, 0);
    }

    fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits up to `within` for the exit, then collects the rest of stdout and stderr.
    fn finish(mut self, within: Duration) -> Out {
        self.close_stdin();
        let status = match self.exit.recv_timeout(within) {
            Ok(s) => s,
            Err(e) => panic!("process {} did not exit within {within:?}: {e:?}", self.pid),
        };
        self.done = true;
        let deadline = Instant::now() + LIMIT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("stdout stayed open after exit"),
            }
        }
        let stderr = self.stderr.take().unwrap().join().unwrap();
        let mut stdout = self.seen.join("\n");
        if !stdout.is_empty() {
            stdout.push('\n');
        }
        Out {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A failed test must not leave a leasehold process behind.
        if !self.done && self.exit.try_recv().is_err() {
            // SAFETY: kill(2) on our own child, not reaped yet.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

fn fence(v: &Value) -> u64 {
    v["fence"].as_u64().unwrap()
}

fn holder(v: &Value) -> String {
    v["holder"].as_str().unwrap().to_owned()
}

fn find<'a>(records: &'a [Value], key: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("{key} in {records:?}"))
}

#[test]
fn run_passes_the_lease_to_the_command_and_exits_with_its_status() {
    let s = Store::new();
    let before = leasehold_testkit::mono_ns();
    let out = s.output([
        "run",
        "--key",
        "job",
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        r#"echo "$LEASEHOLD_KEY|$LEASEHOLD_FENCE|$LEASEHOLD_HOLDER|$LEASEHOLD_DEADLINE"; exit 7"#,
    ]);
    assert_eq!(out.code, Some(7), "{out:?}");
    assert_eq!(out.stderr, "");
    let parts: Vec<&str> = out.stdout.trim().split('|').collect();
    assert_eq!(parts.len(), 4, "{out:?}");
    assert_eq!(parts[0], "job");
    let f: u64 = parts[1].parse().unwrap();
    assert!(!parts[2].is_empty());
    // The kill-by deadline on the host's monotonic clock: before the lease's 3 s are over.
    let deadline: u64 = parts[3].parse().unwrap();
    assert!(
        deadline > before && deadline < leasehold_testkit::mono_ns() + 3_000_000_000,
        "{out:?}"
    );

    // Released afterwards, fence kept.
    let rec = s.inspect("job");
    assert_eq!(rec["state"], "free");
    assert_eq!(fence(&rec), f);

    // Death by a signal is 128 + the signal; fences keep increasing.
    let out = s.output([
        "run",
        "--key",
        "job",
        "--",
        "sh",
        "-c",
        r#"echo "$LEASEHOLD_FENCE"; kill -KILL $$"#,
    ]);
    assert_eq!(out.code, Some(128 + libc::SIGKILL), "{out:?}");
    assert!(out.stdout.trim().parse::<u64>().unwrap() > f);
    assert_eq!(s.inspect("job")["state"], "free");

    // The command's arguments reach it as given.
    let out = s.output([
        "run", "--key", "job", "--", "printf", "%s|", "a b", "-c", "--x",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "a b|-c|--x|");
}

#[test]
fn a_command_that_cannot_start_exits_127_and_frees_the_lease() {
    let s = Store::new();
    let out = s.output(["run", "--key", "k", "--", "/nonexistent/command"]);
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(out.one_stderr_line().contains("/nonexistent/command"));
    assert_eq!(s.inspect("k")["state"], "free");
}

#[test]
fn a_held_lease_is_not_obtained_exit_75_naming_the_holder() {
    let s = Store::new();
    let mut first = s.spawn(["run", "--key", "k", "--", "sh", "-c", UNTIL_EOF]);
    first.wait_line("ready");
    let rec = s.inspect("k");
    assert_eq!(rec["state"], "held");
    let who = holder(&rec);

    let out = s.output(["run", "--key", "k", "--no-wait", "--", "echo", "never"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stdout, "");
    let line = out.one_stderr_line();
    assert!(line.contains(&who), "{line}");

    let t = Instant::now();
    let out = s.output([
        "run", "--key", "k", "--wait", "300ms", "--", "echo", "never",
    ]);
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.one_stderr_line().contains(&who), "{out:?}");

    // The holder was not disturbed; once it finishes the lease is free.
    let out = first.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stderr, "");
    let out = s.output(["run", "--key", "k", "--no-wait", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// Waits until the record of `key` shows a registered waiter. The waiter emits nothing while it
/// waits, so this polls the record (bounded).
fn wait_for_waiter(s: &Store, key: &str) {
    let deadline = Instant::now() + LIMIT;
    while s.inspect(key)["waiter"].is_null() {
        assert!(Instant::now() < deadline, "no waiter registered on {key}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes waiting for one key are served in the order they began to wait: each joins the
/// line (seen in the record) before the next starts.
fn waiting_processes_are_served_in_arrival_order(s: &Store) {
    let mut holder = s.spawn(["run", "--key", "line", "--", "sh", "-c", UNTIL_EOF]);
    holder.wait_line("ready");
    let order = s.path("order");
    let mut waiters = Vec::new();
    for i in 0..4usize {
        let append = format!("echo {i} >> '{}'", order.display());
        waiters.push(s.spawn(["run", "--key", "line", "--", "sh", "-c", &append]));
        let deadline = Instant::now() + LIMIT;
        loop {
            let r = s.inspect("line");
            let in_line =
                usize::from(!r["waiter"].is_null()) + r["queue"].as_array().map_or(0, Vec::len);
            if in_line == i + 1 {
                break;
            }
            assert!(Instant::now() < deadline, "waiter {i} not in line: {r}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    holder.close_stdin();
    assert_eq!(holder.finish(LIMIT).code, Some(0));
    for w in waiters {
        let out = w.finish(LIMIT);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "0\n1\n2\n3\n");
}

#[test]
fn waiting_processes_are_served_in_arrival_order_on_files_and_redis() {
    waiting_processes_are_served_in_arrival_order(&Store::new());
    let redis = leasehold_testkit::servers::RedisServer::start();
    waiting_processes_are_served_in_arrival_order(&Store::at(redis.url()));
}

#[test]
fn by_default_run_waits_until_the_holder_is_done() {
    let s = Store::new();
    let mut first = s.spawn(["run", "--key", "k", "--", "sh", "-c", UNTIL_EOF]);
    first.wait_line("ready");
    let first_fence = fence(&s.inspect("k"));

    let waiter = s.spawn([
        "run",
        "--key",
        "k",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    wait_for_waiter(&s, "k");
    first.close_stdin();
    assert_eq!(first.finish(LIMIT).code, Some(0));
    let out = waiter.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.trim().parse::<u64>().unwrap() > first_fence);
}

#[test]
fn a_signal_ends_the_wait_with_128_plus_the_signal() {
    let s = Store::new();
    let mut first = s.spawn(["run", "--key", "k", "--", "sh", "-c", UNTIL_EOF]);
    first.wait_line("ready");

    let quitter = s.spawn(["run", "--key", "k", "--", "echo", "never"]);
    wait_for_waiter(&s, "k");
    quitter.signal(libc::SIGTERM);
    let out = quitter.finish(LIMIT);
    assert_eq!(out.code, Some(128 + libc::SIGTERM), "{out:?}");
    assert!(out.one_stderr_line().contains("SIGTERM"), "{out:?}");
    assert_eq!(out.stdout, "");

    first.close_stdin();
    assert_eq!(first.finish(LIMIT).code, Some(0));
}

#[test]
fn a_lost_lease_stops_the_command_and_exits_76() {
    let s = Store::new();
    // SIGTERM first, as asked: the overlap window.
    let mut run = s.spawn([
        "run",
        "--key",
        "k",
        "--ttl",
        "1s",
        "--overlap-grace",
        "10s",
        "--",
        "sh",
        "-c",
        TRAP_TERM,
    ]);
    run.wait_line("ready");
    let rec = s.inspect("k");
    let t = Instant::now();

    let out = s.output(["release", "--force", "k"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains(&holder(&rec)), "{out:?}");
    assert!(
        out.stdout.contains(&format!("fence {}", fence(&rec))),
        "{out:?}"
    );
    assert!(out.stderr.contains("WARN"), "logged at warn: {out:?}");

    run.wait_line("got-TERM");
    let out = run.finish(Duration::from_secs(15));
    assert!(t.elapsed() < Duration::from_secs(15));
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(
        out.stdout.contains("got-TERM"),
        "the command got SIGTERM: {out:?}"
    );
    // One line from leasehold; the shell may add "Terminated" for its `sleep`, which got the
    // SIGTERM too (the command's process group is signalled).
    let ours: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("leasehold: "))
        .collect();
    assert_eq!(ours.len(), 1, "{out:?}");
    assert!(
        ours[0].contains("lost") && ours[0].contains("released by someone else"),
        "{out:?}"
    );
}

#[test]
fn termination_signals_are_forwarded_and_the_lease_released_afterwards() {
    let s = Store::new();
    for (sig, name) in [
        (libc::SIGTERM, "TERM"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGINT, "INT"),
    ] {
        let script = TRAP_TERM.replace("TERM", name);
        let mut run = s.spawn(["run", "--key", "k", "--", "sh", "-c", &script]);
        run.wait_line("ready");
        run.signal(sig);
        let out = run.finish(LIMIT);
        assert_eq!(out.code, Some(3), "{name}: the command's status: {out:?}");
        assert!(out.stdout.contains(&format!("got-{name}")), "{out:?}");
        // Nothing from leasehold. (The shell may report the `sleep` it waited for, which the
        // signal to the group ended too: "Hangup", "Terminated".)
        assert!(!out.stderr.contains("leasehold"), "{name}: {out:?}");
        // Released, not merely abandoned: the record is free at once.
        assert_eq!(s.inspect("k")["state"], "free", "{name}");
        let out = s.output(["run", "--key", "k", "--no-wait", "--", "true"]);
        assert_eq!(out.code, Some(0), "{name}: {out:?}");
    }
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let s = Store::new();
    let mut run = s.spawn([
        "run",
        "--key",
        "k",
        "--grace",
        "300ms",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo ready; read x",
    ]);
    run.wait_line("ready");
    let t = Instant::now();
    run.signal(libc::SIGTERM);
    // stdin stays open until finish(); the command leaves only by SIGKILL.
    let exit = run.exit.recv_timeout(LIMIT).unwrap();
    run.done = true;
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(exit.code(), Some(128 + libc::SIGKILL));
    assert_eq!(s.inspect("k")["state"], "free");
}

/// The fields of a `/proc/PID/stat` file after the command name (which may hold spaces and
/// parentheses): `STATE PPID PGRP SESSION …`; `None` once the process is gone.
fn stat_fields(stat_file: &Path) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(stat_file).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether `pid` has exited (gone, or a zombie waiting for init).
fn exited(pid: i32) -> bool {
    stat_fields(Path::new(&format!("/proc/{pid}/stat")))
        .is_none_or(|f| f.first().is_some_and(|state| state == "Z"))
}

#[test]
fn the_command_s_children_are_stopped_with_it() {
    let s = Store::new();
    let pidfile = s.path("grandchild.pid");
    // The grandchild ignores SIGTERM too: only the SIGKILL to the group after the grace ends it.
    let script = "trap '' TERM; (exec sleep 60) & echo $! > \"$PIDFILE\"; echo ready; read x";
    let mut cmd = s.cmd([
        "run", "--key", "k", "--grace", "300ms", "--", "sh", "-c", script,
    ]);
    cmd.env("PIDFILE", &pidfile);
    let mut run = Proc::spawn(cmd);
    run.wait_line("ready");
    let grandchild = read_pid(&pidfile);
    assert!(!exited(grandchild));
    run.signal(libc::SIGTERM);
    let exit = run.exit.recv_timeout(LIMIT).unwrap();
    run.done = true;
    assert_eq!(exit.code(), Some(128 + libc::SIGKILL));
    assert!(
        awaits_exit(grandchild),
        "the command's child {grandchild} outlived it"
    );
    assert_eq!(s.inspect("k")["state"], "free");
}

/// Waits up to [`LIMIT`] for `pid` (not our child) to exit, through a pidfd that becomes
/// readable when it does; whether it did.
fn awaits_exit(pid: i32) -> bool {
    // SAFETY: pidfd_open(2) takes a pid and flags; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        // Already gone (and reaped).
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap()) };
    let mut poll = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(LIMIT.as_millis()).unwrap();
    // SAFETY: poll(2) on one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, ms) == 1 }
}

/// The pid a child wrote to `path`.
fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_killed_run_takes_the_command_and_its_children_with_it() {
    let s = Store::new();
    let pidfile = s.path("grandchild.pid");
    let script =
        "(exec sleep 60) & echo $! > \"$PIDFILE\"; echo $$ > \"$PIDFILE.sh\"; echo ready; read x";
    let mut cmd = s.cmd(["run", "--key", "k", "--ttl", "1s", "--", "sh", "-c", script]);
    cmd.env("PIDFILE", &pidfile);
    let mut run = Proc::spawn(cmd);
    run.wait_line("ready");
    let grandchild = read_pid(&pidfile);
    let child = read_pid(&s.path("grandchild.pid.sh"));
    assert!(!exited(grandchild) && !exited(child));
    // No release, no forwarding: only the kernel and the guard act.
    run.signal(libc::SIGKILL);
    let exit = run.exit.recv_timeout(LIMIT).unwrap();
    run.done = true;
    assert_eq!(exit.signal(), Some(libc::SIGKILL));
    assert!(awaits_exit(child), "the command {child} outlived leasehold");
    assert!(
        awaits_exit(grandchild),
        "the command's child {grandchild} outlived leasehold"
    );
}

#[test]
fn what_the_command_leaves_running_is_killed_when_the_run_ends() {
    let s = Store::new();
    let pidfile = s.path("leftover.pid");
    // The command exits at once, leaving a background process in its group.
    let script = "(exec sleep 60) & echo $! > \"$PIDFILE\"; exit 4";
    let mut cmd = s.cmd(["run", "--key", "k", "--", "sh", "-c", script]);
    cmd.env("PIDFILE", &pidfile);
    let out = Proc::spawn(cmd).finish(LIMIT);
    assert_eq!(out.code, Some(4), "{out:?}");
    let leftover = read_pid(&pidfile);
    assert!(awaits_exit(leftover), "{leftover} outlived the lease");
    assert_eq!(s.inspect("k")["state"], "free");
}

#[test]
fn on_handoff_signals_the_holder_when_someone_waits() {
    let s = Store::new();
    let marker = s.path("handed-over");
    let mut cmd = s.cmd([
        "run",
        "--key",
        "k",
        "--ttl",
        "1s",
        "--on-handoff",
        "USR1",
        "--",
        "sh",
        "-c",
        TRAP_USR1,
    ]);
    cmd.env("MARKER", &marker);
    let mut holder = Proc::spawn(cmd);
    holder.wait_line("ready");
    let first = fence(&s.inspect("k"));

    let t = Instant::now();
    let out = s.output([
        "run",
        "--key",
        "k",
        "--wait",
        "10s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(out.stdout.trim().parse::<u64>().unwrap() > first);
    assert!(marker.exists(), "the holder's command got SIGUSR1");

    let out = holder.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("got-USR1"), "{out:?}");
    assert_eq!(out.stderr, "");
}

/// Writes a record file by hand, as the file store keeps them (`<key>.lease`, JSON).
fn write_record(dir: &Path, name: &str, body: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), body).unwrap();
}

const STALE: &str = r#"{
  "key": "stale",
  "holder": "ghost-1",
  "token": "0123456789abcdef0123456789abcdef",
  "fence": 5,
  "acquired": "2020-01-01T00:00:00Z",
  "renewed": "2020-01-01T00:00:00Z",
  "expires": "2020-01-01T00:00:30Z",
  "ttl_ms": 30000
}
"#;

#[test]
fn ls_and_inspect_show_records_as_tables_lines_and_json() {
    let s = Store::new();
    let mut alice = s.spawn([
        "run",
        "--key",
        "user:alice",
        "--label",
        "team=core",
        "--",
        "sh",
        "-c",
        UNTIL_EOF,
    ]);
    alice.wait_line("ready");
    for key in ["user:bob", "other"] {
        assert_eq!(s.output(["run", "--key", key, "--", "true"]).code, Some(0));
    }
    write_record(&s.locks(), "stale.lease", STALE);
    write_record(
        &s.locks(),
        "broken.lease",
        "{\"key\": \"broken\", \"fence\": 12, tr",
    );

    // JSON: every record, with its state; the corrupt one by name and detail.
    let all = s.ls_json(None);
    assert_eq!(all.len(), 5, "{all:?}");
    let a = find(&all, "user:alice");
    assert_eq!(a["state"], "held");
    assert_eq!(a["labels"]["team"], "core");
    assert!(
        a.get("token").is_none(),
        "owner tokens are not printed: {a}"
    );
    let who = holder(a);
    assert_eq!(find(&all, "user:bob")["state"], "free");
    assert_eq!(find(&all, "stale")["state"], "expired");
    let corrupt = all.iter().find(|r| r["state"] == "corrupt").unwrap();
    assert_eq!(corrupt["name"], "broken.lease");
    assert!(!corrupt["detail"].as_str().unwrap().is_empty());

    let users = s.ls_json(Some("user:"));
    let keys: Vec<&str> = users.iter().filter_map(|r| r["key"].as_str()).collect();
    assert_eq!(keys, ["user:alice", "user:bob"]);

    // The table.
    let out = s.output(["ls"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    for col in ["KEY", "HOLDER", "FENCE", "EXPIRES IN", "WAITER"] {
        assert!(lines[0].contains(col), "{}", out.stdout);
    }
    let row = |start: &str| {
        *lines
            .iter()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("{start} in\n{}", out.stdout))
    };
    let alice_row = row("user:alice ");
    assert!(alice_row.contains(&who) && alice_row.contains(&fence(a).to_string()));
    assert!(row("user:bob ").contains("free"));
    assert!(row("stale ").contains("expired") && row("stale ").contains("ghost-1"));
    assert!(row("broken.lease ").contains("corrupt"));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("corrupt record broken.lease: ")),
        "{}",
        out.stdout
    );

    // inspect, for people: one field per line.
    let out = s.output(["inspect", "user:alice"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    for want in [
        "key: user:alice".to_owned(),
        "state: held".into(),
        format!("holder: {who}"),
        format!("fence: {}", fence(a)),
        "waiter: -".into(),
        "labels: team=core".into(),
    ] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "{want} in\n{}",
            out.stdout
        );
    }
    for field in [
        "acquired: 20",
        "expires: 20",
        "remaining: ",
        "pid: ",
        "host: ",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(field)),
            "{field} in\n{}",
            out.stdout
        );
    }
    // … and as JSON.
    let v = s.inspect("user:alice");
    assert_eq!(v["key"], "user:alice");
    assert_eq!(v["holder"], who.as_str());
    assert!(v["remaining_ms"].as_u64().unwrap() > 0);

    // No record, and a corrupt record: exit 1 with one clear line.
    let out = s.output(["inspect", "nobody"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.one_stderr_line().contains("no lease record"), "{out:?}");
    let out = s.output(["inspect", "broken"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.one_stderr_line().contains("corrupt"), "{out:?}");
    let out = s.output(["inspect", "broken", "--json"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["state"], "corrupt");

    alice.close_stdin();
    assert_eq!(alice.finish(LIMIT).code, Some(0));
}

#[test]
fn cleanup_removes_old_free_and_expired_records_only() {
    let s = Store::new();
    let mut busy = s.spawn(["run", "--key", "busy", "--", "sh", "-c", UNTIL_EOF]);
    busy.wait_line("ready");
    assert_eq!(
        s.output(["run", "--key", "fresh", "--", "true"]).code,
        Some(0)
    );
    write_record(&s.locks(), "stale.lease", STALE);

    let out = s.output(["cleanup"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.starts_with("removed 1 record, kept 2 records"),
        "{out:?}"
    );
    assert_eq!(out.stderr, "", "no progress when piped");
    assert_eq!(s.output(["inspect", "stale"]).code, Some(1));

    let out = s.output(["cleanup", "--older-than", "0s"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.starts_with("removed 1 record, kept 1 record"),
        "{out:?}"
    );
    let keys: Vec<Value> = s.ls_json(None).iter().map(|r| r["key"].clone()).collect();
    assert_eq!(keys, ["busy"]);

    busy.close_stdin();
    assert_eq!(busy.finish(LIMIT).code, Some(0));
}

/// On a terminal `cleanup` shows keys done of keys found; its result line is the piped one.
#[test]
fn cleanup_shows_its_progress_on_a_terminal_only() {
    let s = Store::new();
    for i in 0..200 {
        let body = STALE.replace("\"stale\"", &format!("\"stale-{i}\""));
        write_record(&s.locks(), &format!("stale-{i}.lease"), &body);
    }
    // `script` (util-linux) gives the command a terminal.
    let line = format!("{BIN} --store {} cleanup --older-than 0s", s.url);
    let tty = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env_remove("LEASEHOLD_STORE")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert_eq!(tty.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("removing records free for over 0s [") && shown.contains(" keys "),
        "{shown}"
    );
    assert!(
        shown.contains("removed 200 records, kept 0 records"),
        "{shown}"
    );
    assert!(s.ls_json(None).is_empty());
}

#[test]
fn release_needs_force_and_says_when_nobody_held_the_lease() {
    let s = Store::new();
    let out = s.output(["release", "k"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    let line = out.one_stderr_line();
    assert!(
        line.contains("only the holder") && line.contains("--force"),
        "{line}"
    );

    let out = s.output(["release", "--force", "k"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("not held"), "{out:?}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let s = Store::new();
    let long = "x".repeat(2000);
    let not_utf8 = OsStr::from_bytes(b"ab\xffcd").to_owned();
    let cases: Vec<Vec<OsString>> = vec![
        vec![
            "run".into(),
            "--key".into(),
            "k".into(),
            "--ttl".into(),
            "5x".into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            "k".into(),
            "--ttl".into(),
            "5ms".into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            "k".into(),
            "--wait".into(),
            "soon".into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            "".into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            long.clone().into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            not_utf8.clone(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            "k".into(),
            "--on-handoff".into(),
            "NOPE".into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "run".into(),
            "--key".into(),
            "k".into(),
            "--label".into(),
            "novalue".into(),
            "--".into(),
            "true".into(),
        ],
        vec!["inspect".into(), not_utf8.clone()],
        vec!["inspect".into(), long.into()],
        vec!["release".into(), "--force".into(), "".into()],
        vec!["ls".into(), "--prefix".into(), not_utf8],
        vec!["cleanup".into(), "--older-than".into(), "forever".into()],
    ];
    for args in cases {
        let out = s.output(&args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert_eq!(out.stdout, "", "{args:?}");
        out.one_stderr_line();
    }
    // clap's own usage errors (with the usage) exit 2 too.
    let out = s.output([
        "run",
        "--key",
        "k",
        "--wait",
        "1s",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    let out = s.output(["run", "--key", "k"]);
    assert_eq!(out.code, Some(2), "{out:?}");

    // Nothing was locked along the way.
    assert!(s.ls_json(None).is_empty());

    // A bad store URL, from the option or the environment.
    for url in [
        "nope://x",
        "file://relative/dir",
        "file:///tmp/x?colour=blue",
    ] {
        let out = Proc::spawn({
            let mut c = bare();
            c.args(["--store", url, "ls"]);
            c
        })
        .finish(LIMIT);
        assert_eq!(out.code, Some(2), "{url}: {out:?}");
        out.one_stderr_line();
    }
    let out = Proc::spawn({
        let mut c = bare();
        c.env("LEASEHOLD_STORE", "nope://x").args(["inspect", "k"]);
        c
    })
    .finish(LIMIT);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.one_stderr_line().contains("nope://x"), "{out:?}");
}

#[test]
fn the_store_comes_from_the_environment_or_the_state_directory() {
    let s = Store::new();
    let out = Proc::spawn({
        let mut c = bare();
        c.env("LEASEHOLD_STORE", &s.url)
            .args(["run", "--key", "from-env", "--", "true"]);
        c
    })
    .finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(s.inspect("from-env")["state"], "free");

    let state = s.path("state");
    let out = Proc::spawn({
        let mut c = bare();
        c.env("XDG_STATE_HOME", &state)
            .args(["run", "--key", "by-default", "--", "true"]);
        c
    })
    .finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(state
        .join("leasehold")
        .join("locks")
        .join("by-default.lease")
        .exists());
}

/// The writing end of a pipe whose reading end is already closed: a write to it fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

#[test]
fn a_closed_stdout_is_not_an_error() {
    let s = Store::new();
    assert_eq!(s.output(["run", "--key", "k", "--", "true"]).code, Some(0));
    let write = closed_pipe();
    for args in [vec!["ls"], vec!["ls", "--json"], vec!["inspect", "k"]] {
        let out = s
            .cmd(&args)
            .stdout(Stdio::from(write.try_clone().unwrap()))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{args:?}");
    }
}

/// A Cloud Storage store with no credential anywhere (no key file, no gcloud configuration, a
/// metadata server this machine cannot reach): the credential provider retries and warns.
fn without_google_credentials() -> Command {
    let home = tempfile::tempdir().unwrap().keep();
    let mut cmd = bare();
    cmd.args(["--store", "gs://leasehold-nobucket/x", "ls"])
        .env("HOME", &home)
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("CLOUDSDK_CONFIG")
        .env_remove("STORAGE_EMULATOR_HOST")
        .env_remove("LEASEHOLD_LOG");
    cmd
}

#[test]
fn a_dependency_s_retries_stay_behind_the_debug_level() {
    let out = without_google_credentials().output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one line from leasehold, nothing else: {stderr}"
    );
    assert!(
        lines[0].starts_with("leasehold: ")
            && lines[0].contains("no Google credentials found")
            && lines[0].contains("GOOGLE_APPLICATION_CREDENTIALS")
            && lines[0].contains("metadata server"),
        "{stderr}"
    );
    let debug = without_google_credentials()
        .env("LEASEHOLD_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&debug.stderr);
    assert!(
        stderr.lines().count() > 1,
        "LEASEHOLD_LOG=debug shows the sources' answers: {stderr}"
    );
}

#[test]
fn a_closed_stderr_is_not_a_panic() {
    // Warnings at the debug level and the error line, all into the closed pipe.
    let out = without_google_credentials()
        .env("LEASEHOLD_LOG", "debug")
        .stderr(Stdio::from(closed_pipe()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s = Store::new();
    let out = s
        .cmd(["inspect", "no-such-key"])
        .stderr(Stdio::from(closed_pipe()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn help_documents_the_exit_codes() {
    for args in [vec!["--help"], vec!["run", "--help"]] {
        let out = bare().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8(out.stdout).unwrap();
        for want in [
            "Exit status",
            "75",
            "76",
            "LEASEHOLD_STORE",
            "LEASEHOLD_LOG",
        ] {
            assert!(text.contains(want), "{want} in {args:?}:\n{text}");
        }
    }
}

#[test]
fn run_works_on_redis_redlock_and_a_cluster() {
    let server = leasehold_testkit::servers::RedisServer::start();
    let nodes: Vec<_> = (0..3)
        .map(|_| leasehold_testkit::servers::RedisServer::start())
        .collect();
    let cluster = leasehold_testkit::servers::RedisCluster::start();
    for url in [
        server.url(),
        leasehold_testkit::servers::redlock_url(&nodes),
        cluster.url(),
    ] {
        let out = bare()
            .args([
                "--store",
                &url,
                "run",
                "--key",
                "agent-1",
                "--",
                "sh",
                "-c",
                "echo $LEASEHOLD_FENCE",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let fence: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(fence >= 1);
        // Released on every node before leasehold exited (Redlock answers once a majority did,
        // and leasehold waits for the slower nodes' calls before it exits).
        let mut record = "leasehold:lock:agent-1";
        let servers: Vec<&leasehold_servers::RedisServer> = if url.starts_with("redlock") {
            nodes.iter().map(|n| &**n).collect()
        } else if url.starts_with("redis+cluster") {
            record = "leasehold:lock:{agent-1}";
            cluster.primary_for(record).into_iter().collect()
        } else {
            vec![&*server]
        };
        assert!(!servers.is_empty(), "{url}: no server for {record}");
        for _ in 0..5 {
            let out = bare()
                .args(["--store", &url, "run", "--key", "agent-1", "--", "true"])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
            for s in &servers {
                assert_eq!(
                    s.command(&["EXISTS", record]).as_deref(),
                    Some(":0\r\n"),
                    "{url}: a node kept the record after leasehold exited"
                );
            }
        }
        held_elsewhere_exits_75(&url, "agent-1");
        let out = bare()
            .args(["--store", &url, "ls", "--json"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        elect_hands_over(&url);
    }
}

/// Held by another process: `run --no-wait` exits 75 naming the holder.
fn held_elsewhere_exits_75(url: &str, key: &str) {
    let mut holder = bare()
        .args([
            "--store", url, "run", "--key", key, "--", "sh", "-c", UNTIL_EOF,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let out = bare()
        .args([
            "--store",
            url,
            "run",
            "--key",
            key,
            "--no-wait",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{url}: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("held by"),
        "{out:?}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

/// Two `elect` candidates on the store at `url`: the second, waiting, leads within a second of
/// the first stepping down, with a higher fence; `watch` sees each leader. And `bench` runs there.
fn elect_hands_over(url: &str) {
    let out = bare()
        .args([
            "--store",
            url,
            "bench",
            "--tasks",
            "2",
            "--duration",
            "100ms",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["count"].as_u64() > Some(0)),
        "{url}: {v}"
    );
    let leasehold = |args: &[&str]| {
        let mut c = bare();
        c.args(["--store", url]).args(args);
        Proc::spawn(c)
    };
    let elect = || leasehold(&["elect", "--key", "leader", "--ttl", "2s"]);
    let mut watch = leasehold(&["watch", "leader", "--every", "100ms"]);
    let mut a = elect();
    let first = last_number(&a.wait_line_starting("elected leader "));
    let seen = watch.wait_line_starting("leader held ");
    assert!(
        seen.starts_with(&format!("leader held fence {first} holder ")),
        "{url}: {seen}"
    );
    let mut b = elect();
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = bare()
            .args(["--store", url, "inspect", "leader", "--json"])
            .output()
            .unwrap();
        let record: Value = serde_json::from_slice(&out.stdout).unwrap();
        if !record["waiter"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "{url}: no waiter registered");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.signal(libc::SIGTERM);
    let t = Instant::now();
    assert_eq!(a.finish(LIMIT).code, Some(0), "{url}");
    let second = last_number(&b.wait_line_starting("elected leader "));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{url}: {:?}",
        t.elapsed()
    );
    assert!(second > first, "{url}: fence {second} after {first}");
    let seen = watch.wait_line_starting(&format!("leader held fence {second} "));
    assert!(seen.contains(" holder "), "{url}: {seen}");
    b.signal(libc::SIGTERM);
    assert_eq!(b.finish(LIMIT).code, Some(0), "{url}");
    watch.signal(libc::SIGTERM);
    assert_eq!(watch.finish(LIMIT).code, Some(0), "{url}");
}

#[test]
fn run_works_on_kubernetes_leases() {
    let server = leasehold_testkit::servers::ApiServer::start();
    let url = format!("{}&prefix=task-llm-", server.store_url("jobs"));
    let run = |args: &[&str]| bare().arg("--store").arg(&url).args(args).output().unwrap();
    let out = run(&[
        "run",
        "--key",
        "Agent/1",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let first: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(first >= 1);

    // Held by another process: kubectl shows the holder; --no-wait exits 75 naming it; a waiting
    // run gets the lease once the holder is done.
    let mut holder = bare()
        .args([
            "--store", &url, "run", "--key", "Agent/1", "--", "sh", "-c", UNTIL_EOF,
        ])
        .env("POD_NAME", "pod-a")
        .env("POD_NAMESPACE", "jobs")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let names = Command::new("kubectl")
        .env("KUBECONFIG", server.kubeconfig("jobs"))
        .args(["get", "leases", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.holderIdentity} {.metadata.annotations.leasehold\\.io/key}{\"\\n\"}{end}"])
        .output()
        .expect("kubectl (apt-get install kubernetes-client)");
    let listing = String::from_utf8_lossy(&names.stdout);
    let row = listing
        .lines()
        .find(|l| l.starts_with("task-llm-agent-1--"))
        .unwrap_or_else(|| panic!("{listing} {names:?}"));
    assert!(row.ends_with(" jobs/pod-a Agent/1"), "{row}");

    let out = run(&["run", "--key", "Agent/1", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pod-a"),
        "{out:?}"
    );
    let waiter = bare()
        .args([
            "--store",
            &url,
            "run",
            "--key",
            "Agent/1",
            "--wait",
            "20s",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let later: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(later > first);

    let out = run(&["ls", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    let out = run(&["inspect", "Agent/1", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fence(&rec), later);
    elect_hands_over(&url);
}

/// A `leasehold` process on a terminal of its own (a pseudo-terminal whose session it leads, so
/// it and its command are the terminal's foreground process group, as in an interactive shell).
struct OnTerminal {
    pid: libc::pid_t,
    exit: Receiver<ExitStatus>,
    done: bool,
    master: std::fs::File,
    lines: Receiver<String>,
    seen: Vec<String>,
    /// Which of `seen` a `wait_for` matched.
    matched: Vec<bool>,
}

impl OnTerminal {
    fn spawn(mut cmd: Command) -> Self {
        use std::os::unix::process::CommandExt;
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty(3) writes two descriptors into the given ints; the other arguments may
        // be null.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty returned two open descriptors that nothing else owns.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                OwnedFd::from_raw_fd(slave),
            )
        };
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid(2) and ioctl(2) are async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let (tx, exit) = mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait().unwrap()));
        // Our copies of the terminal's end close with `cmd`, so reading ends (EIO) once every
        // process on the terminal has exited.
        drop(cmd);
        let (tx, lines) = mpsc::channel();
        let reader = master.try_clone().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if tx.send(line.trim_end_matches('\r').to_owned()).is_err() {
                    break;
                }
            }
        });
        OnTerminal {
            pid,
            exit,
            done: false,
            master,
            lines,
            seen: vec![],
            matched: vec![],
        }
    }

    /// Waits for a line that contains `want` and was not matched before (in any order: a child's
    /// output and leasehold's log lines race).
    fn wait_for(&mut self, want: &str) {
        let deadline = Instant::now() + LIMIT;
        let mut next = 0;
        loop {
            while next < self.seen.len() {
                if !self.matched[next] && self.seen[next].contains(want) {
                    self.matched[next] = true;
                    return;
                }
                next += 1;
            }
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    self.seen.push(line);
                    self.matched.push(false);
                }
                Err(e) => panic!(
                    "no line with {want:?} ({e:?}); terminal so far {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Types `bytes` on the terminal's keyboard.
    fn type_in(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.master.write_all(bytes).unwrap();
    }

    fn signal(&self, sig: i32) {
        assert!(!self.done);
        // SAFETY: kill(2) on our own child, not reaped yet (its exit was not received).
        assert_eq!(unsafe { libc::kill(self.pid, sig) }, 0);
    }

    /// Waits for the exit; returns the exit code and everything the terminal showed.
    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let status = self.exit.recv_timeout(LIMIT).unwrap();
        self.done = true;
        while let Ok(line) = self.lines.recv_timeout(LIMIT) {
            self.seen.push(line);
        }
        (status.code(), std::mem::take(&mut self.seen))
    }
}

impl Drop for OnTerminal {
    fn drop(&mut self) {
        // A failed test must not leave a leasehold process behind.
        if !self.done && self.exit.try_recv().is_err() {
            // SAFETY: kill(2) on our own child, not reaped yet.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_command_once() {
    let s = Store::new();
    // Counts SIGINTs; SIGTERM ends it with 3.
    let script = "trap 'echo got-INT' INT; trap 'echo got-TERM; exit 3' TERM; echo ready; \
        while :; do sleep 0.1 </dev/null >/dev/null 2>&1 & wait $!; done";
    let mut cmd = s.cmd(["run", "--key", "k", "--", "sh", "-c", script]);
    cmd.env("LEASEHOLD_LOG", "info");
    let mut t = OnTerminal::spawn(cmd);
    t.wait_for("ready");
    // Ctrl-C: the terminal sends SIGINT to its foreground group, leasehold and the command alike.
    t.type_in(b"\x03");
    t.wait_for("got-INT");
    // leasehold saw it too, and knows the command got it from the terminal.
    t.wait_for("not forwarding");
    // A SIGINT sent to leasehold by a process is still passed on (once).
    t.signal(libc::SIGINT);
    t.wait_for("got-INT");
    t.signal(libc::SIGTERM);
    let (code, seen) = t.finish();
    assert_eq!(code, Some(3), "the command's status: {seen:?}");
    let ints = seen.iter().filter(|l| l.contains("got-INT")).count();
    assert_eq!(ints, 2, "one SIGINT per Ctrl-C and one per kill: {seen:?}");
    assert_eq!(s.inspect("k")["state"], "free");
}

/// A shell script that starts a daemon of the usual kind — a new session (`setsid`), its output
/// elsewhere — writes the daemon's pid to `$PIDFILE` once it is in its new session (through the
/// FIFO `$PIDFILE.fifo`, no polling) and its own to `$PIDFILE.sh`, then runs `rest`.
fn starts_a_daemon(rest: &str) -> String {
    format!(
        "mkfifo \"$PIDFILE.fifo\"; \
         setsid sh -c 'echo $$ > \"$PIDFILE.fifo\"; exec sleep 60 >/dev/null 2>&1' </dev/null & \
         read pid < \"$PIDFILE.fifo\"; echo $pid > \"$PIDFILE\"; echo $$ > \"$PIDFILE.sh\"; {rest}"
    )
}

/// The session of `pid`.
fn session_of(pid: i32) -> i32 {
    stat_fields(Path::new(&format!("/proc/{pid}/stat"))).unwrap()[3]
        .parse()
        .unwrap()
}

/// The daemon `starts_a_daemon` started, checked to have left the command's session.
fn escaped_daemon(s: &Store) -> i32 {
    let daemon = read_pid(&s.path("daemon.pid"));
    let shell = read_pid(&s.path("daemon.pid.sh"));
    assert_ne!(session_of(daemon), session_of(shell), "not a new session");
    assert!(!exited(daemon));
    daemon
}

#[test]
fn a_daemon_the_command_started_ends_with_the_run() {
    let s = Store::new();
    let script = starts_a_daemon("echo ready; read x; exit 4");
    let mut cmd = s.cmd(["run", "--key", "k", "--", "sh", "-c", &script]);
    cmd.env("PIDFILE", s.path("daemon.pid"));
    let mut run = Proc::spawn(cmd);
    run.wait_line("ready");
    let daemon = escaped_daemon(&s);
    let out = run.finish(LIMIT); // Closes stdin: the command exits.
    assert_eq!(out.code, Some(4), "{out:?}");
    assert!(awaits_exit(daemon), "the daemon {daemon} outlived the run");
    assert_eq!(s.inspect("k")["state"], "free");
}

#[test]
fn a_lost_lease_ends_the_command_s_daemons_too() {
    let s = Store::new();
    let script = starts_a_daemon(TRAP_TERM);
    let mut cmd = s.cmd(["run", "--key", "k", "--", "sh", "-c", &script]);
    cmd.env("PIDFILE", s.path("daemon.pid"));
    let mut run = Proc::spawn(cmd);
    run.wait_line("ready");
    let daemon = escaped_daemon(&s);
    assert_eq!(s.output(["release", "--force", "k"]).code, Some(0));
    let out = run.finish(LIMIT);
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(
        awaits_exit(daemon),
        "the daemon {daemon} outlived the lease"
    );
}

#[test]
fn on_a_terminal_what_the_command_leaves_running_ends_with_the_run() {
    let s = Store::new();
    let pidfile = s.path("leftover.pid");
    // On a terminal the command shares leasehold's process group (no group guard).
    let script = "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > \"$PIDFILE\"; echo ready; exit 4";
    let run = s.cmd(["run", "--key", "k", "--", "sh", "-c", script]);
    // leasehold under a shell that leads the terminal's session, as at a prompt: when leasehold
    // exits, nobody hangs up on the terminal's processes.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "\"$@\"; echo status $?; read x", "sh"])
        .arg(run.get_program())
        .args(run.get_args())
        .env("PIDFILE", &pidfile);
    for (name, value) in run.get_envs() {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let mut t = OnTerminal::spawn(cmd);
    t.wait_for("ready");
    t.wait_for("status 4");
    let leftover = read_pid(&pidfile);
    assert!(awaits_exit(leftover), "{leftover} outlived the run");
    t.type_in(b"\n");
    let (code, seen) = t.finish();
    assert_eq!(code, Some(0), "{seen:?}");
    assert_eq!(s.inspect("k")["state"], "free");
}

/// The zombie children of `pid` (exited, not reaped).
fn zombie_children(pid: i32) -> usize {
    let parent = pid.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| stat_fields(&e.path().join("stat")))
        .filter(|f| f.len() > 1 && f[0] == "Z" && f[1] == parent)
        .count()
}

#[test]
fn orphans_of_a_long_run_are_reaped_while_it_runs() {
    let s = Store::new();
    // Each subshell exits at once, leaving its `sleep 0` to leasehold (the subreaper).
    let script =
        "for i in 1 2 3 4 5; do (sleep 0 </dev/null >/dev/null 2>&1 &); done; echo ready; read x; exit 0";
    let mut run = s.spawn(["run", "--key", "k", "--", "sh", "-c", script]);
    run.wait_line("ready");
    // Reaping follows each SIGCHLD; no event says when, so this looks until none is left.
    let deadline = Instant::now() + LIMIT;
    while zombie_children(run.pid) > 0 {
        assert!(Instant::now() < deadline, "orphans left as zombies");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(run.finish(LIMIT).code, Some(0));
}

/// The number a line ends with (a fence).
fn last_number(line: &str) -> u64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn elect_hands_leadership_over_and_campaigns_again_after_a_loss() {
    let s = Store::new();
    let mut a = s.spawn(["elect", "--key", "lead", "--ttl", "2s"]);
    let first = last_number(&a.wait_line_starting("elected lead "));
    let mut b = s.spawn(["elect", "--key", "lead", "--ttl", "2s", "--json"]);
    wait_for_waiter(&s, "lead");
    // The leader steps down on SIGTERM: released, and the candidate waiting takes over at once.
    a.signal(libc::SIGTERM);
    let t = Instant::now();
    let out = a.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    let elected: Value = serde_json::from_str(&b.wait_line_starting("{")).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "handover took {:?}",
        t.elapsed()
    );
    assert_eq!(elected["event"], "elected");
    assert_eq!(elected["key"], "lead");
    assert!(fence(&elected) > first, "{elected}");
    assert_eq!(elected["holder"], holder(&s.inspect("lead")));
    // Lost (an operator force-releases it): told, and the candidate campaigns again.
    assert_eq!(s.output(["release", "--force", "lead"]).code, Some(0));
    let lost: Value = serde_json::from_str(&b.wait_line_starting("{")).unwrap();
    assert_eq!(lost["event"], "lost");
    assert!(
        lost["reason"].as_str().unwrap().contains("released"),
        "{lost}"
    );
    let again: Value = serde_json::from_str(&b.wait_line_starting("{")).unwrap();
    assert_eq!(again["event"], "elected");
    assert!(fence(&again) > fence(&elected), "{again}");
    b.signal(libc::SIGINT);
    assert_eq!(b.finish(LIMIT).code, Some(0));
    assert_eq!(s.inspect("lead")["state"], "free");
}

#[test]
fn elect_runs_the_command_while_leading() {
    let s = Store::new();
    // The trap first: a SIGTERM right after the line must find it.
    let script = "trap 'echo got-TERM; exit 3' TERM; echo leading $LEASEHOLD_FENCE; \
        while :; do sleep 0.1 </dev/null >/dev/null 2>&1 & wait $!; done";
    // SIGTERM first when the store says the lease is gone, as asked (an overlap window).
    let mut a = s.spawn([
        "elect",
        "--key",
        "lead",
        "--overlap-grace",
        "10s",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let first = last_number(&a.wait_line_starting("leading "));
    // Lost: the command is stopped, and started again once elected again.
    assert_eq!(s.output(["release", "--force", "lead"]).code, Some(0));
    a.wait_line("got-TERM");
    let second = last_number(&a.wait_line_starting("leading "));
    assert!(second > first);
    // SIGTERM goes to the command; its status is leasehold's, and the lease is released.
    a.signal(libc::SIGTERM);
    let out = a.finish(LIMIT);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stderr.contains("elected lead"), "{out:?}");
    assert!(out.stderr.contains("lost lead"), "{out:?}");
    assert_eq!(s.inspect("lead")["state"], "free");

    // --once: a lost lease ends the election with 76.
    let mut b = s.spawn(["elect", "--key", "lead", "--once", "--", "sh", "-c", script]);
    b.wait_line_starting("leading ");
    assert_eq!(s.output(["release", "--force", "lead"]).code, Some(0));
    assert_eq!(b.finish(LIMIT).code, Some(76));
}

#[test]
fn watch_tells_each_change_of_a_key() {
    let s = Store::new();
    let mut plain = s.spawn(["watch", "k"]);
    let mut json = s.spawn(["watch", "k", "--json", "--every", "200ms"]);
    plain.wait_line("k none");
    let none: Value = serde_json::from_str(&json.wait_line_starting("{")).unwrap();
    assert_eq!(none["state"], "none");
    let mut run = s.spawn([
        "run", "--key", "k", "--ttl", "1s", "--", "sh", "-c", UNTIL_EOF,
    ]);
    run.wait_line("ready");
    let rec = s.inspect("k");
    let held = plain.wait_line_starting("k held ");
    assert_eq!(
        held,
        format!("k held fence {} holder {}", fence(&rec), holder(&rec))
    );
    let object: Value = serde_json::from_str(&json.wait_line_starting("{")).unwrap();
    assert_eq!(object["state"], "held");
    assert_eq!(object["holder"], holder(&rec));
    assert!(object.get("token").is_none(), "{object}");
    // Renewals (every 333 ms) are not changes: after two of them, the next line is the release.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(run.finish(LIMIT).code, Some(0));
    assert_eq!(
        plain.wait_line_starting("k "),
        format!("k free fence {}", fence(&rec))
    );
    let object: Value = serde_json::from_str(&json.wait_line_starting("{")).unwrap();
    assert_eq!(object["state"], "free");
    plain.signal(libc::SIGINT);
    assert_eq!(plain.finish(LIMIT).code, Some(0));
    json.signal(libc::SIGTERM);
    assert_eq!(json.finish(LIMIT).code, Some(0));
}

/// `watch` through a failover whose old primary hangs (SIGSTOP: its connections stay open and
/// silent), behind a name that moves (a TCP proxy repointed to the promoted replica): its
/// subscription is found dead and made again, the store is looked at again within a second of
/// answering, not after `--every` (30 s here), and a release on the new primary is seen.
#[test]
fn watch_follows_a_hung_failover_to_the_new_primary() {
    use leasehold_testkit::proxy::TcpProxy;
    use leasehold_testkit::servers::{Pausable, RedisServer};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (old, new) = (RedisServer::start(), RedisServer::start());
    assert!(new
        .command(&["REPLICAOF", "127.0.0.1", &old.port.to_string()])
        .is_some_and(|r| r.starts_with("+OK")));
    rt.block_on(new.synced_as_replica());
    let proxy = TcpProxy::start(old.port);
    let url = format!("redis://127.0.0.1:{}/0?timeout=500ms", proxy.port);
    let leasehold = |args: &[&str]| {
        let mut c = bare();
        c.args(["--store", &url]).args(args);
        Proc::spawn(c)
    };
    let (mut holder, mut watch) = held_and_watched(&url);
    rt.block_on(old.replicated_to(&new));

    // The failover: the old primary hangs, the replica is promoted, the name moves.
    old.pause();
    assert!(new
        .command(&["REPLICAOF", "NO", "ONE"])
        .is_some_and(|r| r.starts_with("+OK")));
    proxy.point_to(new.port);
    let out = leasehold(&["release", "--force", "k"]).finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    let released = Instant::now();
    // The record is gone (nobody waited for it), where the file store keeps it free.
    watch.wait_line("k none");
    let took = released.elapsed();
    old.resume();
    assert!(
        took < Duration::from_secs(10),
        "watch saw the release after {took:?}"
    );
    watch.signal(libc::SIGTERM);
    assert_eq!(watch.finish(LIMIT).code, Some(0));
    holder.close_stdin();
    holder.finish(LIMIT);
}

/// On the store at `url`: `hold` of key `k` (30 s TTL), and `watch k --every 30s` once it has
/// printed the held lease.
fn held_and_watched(url: &str) -> (Proc, Proc) {
    let leasehold = |args: &[&str]| {
        let mut c = bare();
        c.args(["--store", url]).args(args);
        Proc::spawn(c)
    };
    let mut holder = leasehold(&["hold", "--key", "k", "--ttl", "30s"]);
    holder.wait_line_starting("held k ");
    let mut watch = leasehold(&["watch", "k", "--every", "30s"]);
    watch.wait_line_starting("k held ");
    (holder, watch)
}

/// `watch` on Redis, Redlock and a Redis Cluster sees a release nobody waited for at once, not
/// after `--every` (30 s here): Redis publishes only releases someone asked for, and `watch`
/// asks for each lease it sees (it marks the record, as a waiting contender does).
#[test]
fn watch_sees_an_uncontended_release_on_redis_at_once() {
    use leasehold_testkit::servers::{redlock_url, RedisCluster, RedisServer};
    let server = RedisServer::start();
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let cluster = RedisCluster::start();
    for url in [server.url(), redlock_url(&nodes), cluster.url()] {
        let (mut holder, mut watch) = held_and_watched(&url);
        let released = Instant::now();
        holder.close_stdin();
        assert_eq!(holder.finish(LIMIT).code, Some(0), "{url}");
        watch.wait_line("k none");
        let took = released.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "{url}: watch saw the release after {took:?}"
        );
        watch.signal(libc::SIGTERM);
        assert_eq!(watch.finish(LIMIT).code, Some(0), "{url}");
    }
}

/// `--metrics ADDR` on `elect` (and `run`, `hold`): the lease metrics and, for a candidate,
/// `leasehold_leader`, scraped over HTTP; a taken address fails the command at once.
#[test]
fn candidates_serve_their_metrics() {
    use leasehold_testkit::servers::{free_port, http_get};
    let s = Store::new();
    let scrape = |port: u16| {
        let (code, text) = http_get(port, "/metrics").unwrap();
        assert_eq!(code, 200, "{text}");
        text
    };
    let (pa, pb) = (free_port(), free_port());
    let candidate = |port: u16| {
        let addr = format!("127.0.0.1:{port}");
        s.spawn(["elect", "--key", "lead", "--ttl", "2s", "--metrics", &addr])
    };
    let mut a = candidate(pa);
    a.wait_line_starting("elected lead ");
    let text = scrape(pa);
    assert!(text.contains("leasehold_leader 1"), "{text}");
    assert!(text.contains("leasehold_acquire_success_total 1"), "{text}");
    let mut b = candidate(pb);
    // b campaigns: serving (once started), not leading.
    let deadline = Instant::now() + LIMIT;
    while !http_get(pb, "/metrics")
        .is_some_and(|(_, text)| text.contains("leasehold_acquire_attempts_total 1"))
    {
        assert!(Instant::now() < deadline, "b never campaigned");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(scrape(pb).contains("leasehold_leader 0"));
    a.signal(libc::SIGTERM);
    assert_eq!(a.finish(LIMIT).code, Some(0));
    b.wait_line_starting("elected lead ");
    let text = scrape(pb);
    assert!(text.contains("leasehold_leader 1"), "{text}");
    assert!(text.contains("leasehold_acquire_success_total 1"), "{text}");

    // Garbage and an endless request head are answered 400, and the server goes on.
    let raw = |bytes: &[u8]| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", pb)).unwrap();
        c.set_read_timeout(Some(LIMIT)).unwrap();
        c.write_all(bytes).unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer);
        answer
    };
    assert!(raw(b"hello\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(raw(&[0xff; 9000]).starts_with("HTTP/1.1 400"));
    assert!(scrape(pb).contains("leasehold_leader 1"));

    // A flood of idle connections (fewer than the listen backlog holds) costs b a bounded number
    // of descriptors (16 served at once, the rest wait in the backlog); once they go, scrapes are
    // answered again.
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{}/fd", b.pid))
            .unwrap()
            .count()
    };
    let before = descriptors();
    let idle: Vec<std::net::TcpStream> = (0..100)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", pb)).unwrap())
        .collect();
    // Connections are taken in (a slot each) before the count is read.
    let deadline = Instant::now() + LIMIT;
    while descriptors() < before + 8 {
        assert!(
            Instant::now() < deadline,
            "the first connections were not taken in: {before} descriptors, then {}",
            descriptors()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Time for more to be taken in, were there no bound (a negative check: nothing to await).
    std::thread::sleep(Duration::from_millis(300));
    let during = descriptors();
    assert!(
        during <= before + 20,
        "{before} descriptors before, {during} with 100 idle connections"
    );
    drop(idle);
    assert!(scrape(pb).contains("leasehold_leader 1"));

    // The address b serves on is taken: another command fails at once, saying so.
    let taken = format!("127.0.0.1:{pb}");
    let out = s.output(["run", "--key", "other", "--metrics", &taken, "--", "true"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.one_stderr_line().contains("cannot serve metrics"),
        "{out:?}"
    );
    b.signal(libc::SIGTERM);
    assert_eq!(b.finish(LIMIT).code, Some(0));
}

#[test]
fn bench_measures_the_store_and_leaves_nothing_held() {
    let s = Store::new();
    let out = s.output(["bench", "--tasks", "1,3", "--duration", "200ms"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("file://"), "{out:?}");
    assert!(lines[2].starts_with("TASKS  KEYS"), "{out:?}");
    // 2 task counts × (distinct keys, one hot key).
    assert_eq!(lines.len(), 3 + 4, "{out:?}");
    // Its progress bar is for a terminal: nothing on a piped stderr.
    assert_eq!(out.stderr, "", "{out:?}");
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("bench.svg");
    let out = s.output([
        "bench",
        "--tasks",
        "1,2",
        "--duration",
        "200ms",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.starts_with("<svg") && drawn.trim_end().ends_with("</svg>"),
        "{drawn:.200}"
    );
    for want in [
        "Waits for one key",
        "1 task",
        "2 tasks",
        "handoffs/s, one key",
    ] {
        assert!(drawn.contains(want), "{want} is not in the plot");
    }
    let out = s.output([
        "bench",
        "--tasks",
        "1",
        "--duration",
        "100ms",
        "--plot",
        "/nonexistent/dir/x.svg",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .starts_with("leasehold: cannot draw /nonexistent/dir/x.svg"),
        "{out:?}"
    );
    let out = s.output([
        "bench",
        "--tasks",
        "2",
        "--duration",
        "200ms",
        "--no-hot",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{v}");
    assert_eq!(runs[0]["keys"], "distinct");
    assert!(runs[0]["count"].as_u64().unwrap() > 0, "{v}");
    assert!(runs[0]["per_second"].as_f64().unwrap() > 0.0, "{v}");
    let held = s
        .ls_json(Some("leasehold-bench/"))
        .into_iter()
        .filter(|r| r["state"] == "held")
        .count();
    assert_eq!(held, 0);
    let out = s.output(["bench", "--tasks", "0"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    out.one_stderr_line();
}

#[test]
fn a_candidate_stopped_while_waiting_gives_up_its_place() {
    let s = Store::new();
    let mut a = s.spawn(["elect", "--key", "lead"]);
    a.wait_line_starting("elected lead ");
    let b = s.spawn(["elect", "--key", "lead"]);
    wait_for_waiter(&s, "lead");
    b.signal(libc::SIGTERM);
    assert_eq!(b.finish(LIMIT).code, Some(128 + libc::SIGTERM));
    // Withdrawn before it exited: the next candidate is not kept waiting for a registration
    // nobody will take up.
    let rec = s.inspect("lead");
    assert!(rec["waiter"].is_null(), "{rec}");
    a.signal(libc::SIGTERM);
    assert_eq!(a.finish(LIMIT).code, Some(0));
}

#[test]
fn hold_keeps_the_lease_while_stdin_is_open() {
    let s = Store::new();
    let mut h = s.spawn(["hold", "--key", "deploy", "--ttl", "1s"]);
    let line = h.wait_line_starting("held deploy ");
    let rec = s.inspect("deploy");
    assert_eq!(
        line,
        format!("held deploy {} {}", holder(&rec), fence(&rec))
    );
    // Held past its TTL (renewed), and refused to others meanwhile.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(s.inspect("deploy")["state"], "held");
    let out = s.output(["hold", "--key", "deploy", "--no-wait"]);
    assert_eq!(out.code, Some(75), "{out:?}");
    // Closing stdin releases it.
    let out = h.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(s.inspect("deploy")["state"], "free");
    // Lost: told, exit 76.
    let mut h = s.spawn(["hold", "--key", "deploy", "--ttl", "1s", "--json"]);
    let held: Value = serde_json::from_str(&h.wait_line_starting("{")).unwrap();
    assert_eq!(held["event"], "held");
    assert_eq!(s.output(["release", "--force", "deploy"]).code, Some(0));
    let lost: Value = serde_json::from_str(&h.wait_line_starting("{")).unwrap();
    assert_eq!(lost["event"], "lost");
    assert_eq!(h.finish(LIMIT).code, Some(76));
}

/// A command that ignores SIGTERM and appends `$ME NANOS` to `$LOG` every 20 ms, forever.
const WRITER: &str = r#"trap '' TERM; echo ready;
    while :; do echo "$ME $(date +%s%N)" >> "$LOG"; sleep 0.02 </dev/null >/dev/null 2>&1; done"#;

/// A command that appends `$ME NANOS` to `$LOG` every 20 ms, 25 times, and exits 0.
const SECOND_WRITER: &str = r#"i=0; while [ $i -lt 25 ]; do echo "$ME $(date +%s%N)" >> "$LOG";
    sleep 0.02 </dev/null >/dev/null 2>&1; i=$((i+1)); done"#;

/// `leasehold --store URL ARGS…` with `ME` and `LOG` set for [`WRITER`].
fn writer(url: &str, me: &str, log: &Path, args: &[&str]) -> Proc {
    let mut c = bare();
    c.args(["--store", url])
        .args(args)
        .env("ME", me)
        .env("LOG", log);
    Proc::spawn(c)
}

/// Asserts that the first holder (`A`) wrote, then the second (`B`), and never `A` after `B`.
fn assert_no_interleaving(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let ts = |l: &str| {
        l.split_whitespace()
            .nth(1)
            .and_then(|t| t.parse::<u64>().ok())
    };
    let first_b = lines
        .iter()
        .position(|l| l.starts_with("B "))
        .unwrap_or_else(|| panic!("the second holder never wrote: {lines:?}"));
    assert!(
        lines[..first_b].iter().any(|l| l.starts_with("A ")),
        "the first holder never wrote"
    );
    let late: Vec<&&str> = lines[first_b..]
        .iter()
        .filter(|l| l.starts_with("A "))
        .collect();
    if let Some(last) = late.last() {
        let overlap =
            ts(last).unwrap_or(0) / 1_000_000 - ts(lines[first_b]).unwrap_or(0) / 1_000_000;
        panic!(
            "both holders' commands ran: {} lines of the first after the second began ({overlap} ms of overlap)",
            late.len()
        );
    }
}

/// A holder cut off from Redis (its connection goes through a proxy that stops forwarding) has
/// its command — which ignores SIGTERM — gone before the lease expires and a second process,
/// reaching Redis directly, is granted it: the two commands never write at the same time.
fn a_holder_cut_off_from_the_store_stops_before_another_is_granted(ttl: &str) {
    use leasehold_testkit::{proxy::TcpProxy, servers::RedisServer};
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let via_proxy = format!("redis://127.0.0.1:{}/0", proxy.port);
    let run = |me| {
        [
            "run", "--key", "k", "--ttl", ttl, "--wait", "60s", "--", "sh", "-c", me,
        ]
    };
    let mut first = writer(&via_proxy, "A", &log, &run(WRITER));
    first.wait_line("ready");
    proxy.pause();
    let second = writer(&redis.url(), "B", &log, &run(SECOND_WRITER));
    let out = second.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_no_interleaving(&log);
    proxy.resume();
    let out = first.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(out.stderr.contains("renewals failing"), "{out:?}");
}

#[test]
fn a_holder_cut_off_from_the_store_stops_before_another_is_granted_ttl_2s() {
    a_holder_cut_off_from_the_store_stops_before_another_is_granted("2s");
}

#[test]
fn a_holder_cut_off_from_the_store_stops_before_another_is_granted_ttl_10s() {
    a_holder_cut_off_from_the_store_stops_before_another_is_granted("10s");
}

/// Two `elect` candidates: the leader cut off from Redis stops its command before the other
/// candidate, reaching Redis directly, is elected and starts its own.
#[test]
fn an_elected_leader_cut_off_from_the_store_stops_before_the_next_leader_starts() {
    use leasehold_testkit::{proxy::TcpProxy, servers::RedisServer};
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let via_proxy = format!("redis://127.0.0.1:{}/0", proxy.port);
    let elect = |me| {
        [
            "elect", "--key", "k", "--ttl", "2s", "--once", "--", "sh", "-c", me,
        ]
    };
    let mut first = writer(&via_proxy, "A", &log, &elect(WRITER));
    first.wait_line("ready");
    proxy.pause();
    let second = writer(&redis.url(), "B", &log, &elect(SECOND_WRITER));
    let out = second.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_no_interleaving(&log);
    proxy.resume();
    assert_eq!(first.finish(Duration::from_secs(60)).code, Some(76));
}

/// A `leasehold run` that is paused (SIGSTOP) cannot stop its command; the command's group guard
/// kills it as the lease runs out, before another process is granted the lease.
#[test]
fn a_paused_holder_s_command_is_killed_before_another_is_granted_the_lease() {
    let redis = leasehold_testkit::servers::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let run = |me| {
        [
            "run", "--key", "k", "--ttl", "2s", "--wait", "60s", "--", "sh", "-c", me,
        ]
    };
    let mut first = writer(&redis.url(), "A", &log, &run(WRITER));
    first.wait_line("ready");
    first.signal(libc::SIGSTOP);
    let second = writer(&redis.url(), "B", &log, &run(SECOND_WRITER));
    let out = second.finish(Duration::from_secs(60));
    first.signal(libc::SIGCONT);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_no_interleaving(&log);
    let out = first.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(76), "{out:?}");
}

/// `hold` tells its script `stop KEY MS` at the stop-by deadline when renewals fail — MS being
/// the time left before the lease could expire — and `lost` only later.
#[test]
fn hold_tells_its_script_to_stop_before_the_lease_can_expire() {
    use leasehold_testkit::{proxy::TcpProxy, servers::RedisServer};
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port);
    let via_proxy = format!("redis://127.0.0.1:{}/0", proxy.port);
    let mut h = Proc::spawn({
        let mut c = bare();
        c.args(["--store", &via_proxy, "hold", "--key", "k", "--ttl", "2s"]);
        c
    });
    h.wait_line_starting("held k ");
    proxy.pause();
    let stop = h.wait_line_starting("stop k ");
    let ms = last_number(&stop);
    assert!((300..=700).contains(&ms), "{stop}");
    h.wait_line_starting("lost k ");
    proxy.resume();
    assert_eq!(h.finish(LIMIT).code, Some(76));
}

/// A lease the store says is gone (force-released) may be held by another process already: the
/// command is killed at once, without a SIGTERM it could spend running next to the new holder.
#[test]
fn a_lease_the_store_says_is_gone_kills_the_command_at_once() {
    let s = Store::new();
    let mut run = s.spawn(["run", "--key", "k", "--", "sh", "-c", TRAP_TERM]);
    run.wait_line("ready");
    assert_eq!(s.output(["release", "--force", "k"]).code, Some(0));
    let out = run.finish(LIMIT);
    assert_eq!(out.code, Some(76), "{out:?}");
    assert!(!out.stdout.contains("got-TERM"), "SIGTERM first: {out:?}");
    assert!(out.stderr.contains("SIGKILL now"), "{out:?}");
    assert!(
        !out.stderr.contains("did not exit in time"),
        "no grace was given, none ran out: {out:?}"
    );
}

/// A --loss-grace that cannot fit before the lease could expire is a usage error naming the
/// largest that fits; the defaults fit the shortest TTLs.
#[test]
fn a_loss_grace_that_cannot_fit_the_ttl_names_the_largest_that_fits() {
    let s = Store::new();
    let out = s.output([
        "run",
        "--key",
        "k",
        "--ttl",
        "2s",
        "--loss-grace",
        "25s",
        "--",
        "true",
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.one_stderr_line().contains("at most 1s 110ms"),
        "{out:?}"
    );
    let out = s.output(["run", "--key", "k", "--ttl", "2s", "--", "true"]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// `run`, `--no-wait`, `ls`, `elect`, `watch` and `bench` on `postgres://`: the fence comes from
/// the server, the row is kept free after the command ends (its fence kept), and a second
/// process meets the first's lease.
#[test]
fn run_works_on_postgres() {
    let server = leasehold_testkit::servers::shared_postgres();
    let url = server.fresh_db();
    let mut fences = vec![];
    for _ in 0..2 {
        let out = bare()
            .args(["--store", &url, "run", "--key", "agent/1", "--"])
            .args(["sh", "-c", "echo $LEASEHOLD_FENCE"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        fences.push(
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap(),
        );
    }
    assert!(fences[1] > fences[0], "{fences:?}");
    let db = url.rsplit('/').next().unwrap();
    assert_eq!(
        server
            .psql(
                db,
                "SELECT token IS NULL FROM leasehold_leases WHERE key = 'agent/1'"
            )
            .as_deref(),
        Some("t"),
        "released, the row kept"
    );
    held_elsewhere_exits_75(&url, "agent/1");
    let out = bare()
        .args(["--store", &url, "ls", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("agent/1"),
        "{out:?}"
    );
    elect_hands_over(&url);
}

#[test]
fn run_works_on_etcd() {
    let server = leasehold_testkit::servers::EtcdServer::start();
    let url = format!(
        "{}?prefix=cli/",
        leasehold_testkit::etcd_cluster::store_url(&server)
    );
    let run = |args: &[&str]| bare().arg("--store").arg(&url).args(args).output().unwrap();
    let out = run(&[
        "run",
        "--key",
        "agent-1",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let first: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(first >= 1);
    // Released before leasehold exited: etcd has no key left under the prefix.
    let keys = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &server.url(),
            "get",
            "--prefix",
            "cli/",
            "--keys-only",
        ])
        .output()
        .expect("etcdctl (apt-get install etcd-client)");
    assert!(keys.status.success(), "{keys:?}");
    assert_eq!(String::from_utf8_lossy(&keys.stdout).trim(), "", "{keys:?}");
    // Held by another process: --no-wait exits 75 naming the holder.
    let mut holder = bare()
        .args([
            "--store", &url, "run", "--key", "agent-1", "--", "sh", "-c", UNTIL_EOF,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let out = run(&["run", "--key", "agent-1", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("held by"),
        "{out:?}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let out = run(&[
        "run",
        "--key",
        "agent-1",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    let second: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(second > first, "fence {second} after {first}");
    elect_hands_over(&url);
}

/// A command that enters the counter directory `$SLOTS` (a file of its own), appends how many
/// are inside to `$LOG` (`ROLE.PID` names, on read-write keys), works for 0.3 s and leaves.
const SLOT: &str =
    r#"touch "$SLOTS/$ROLE.$$"; echo $(ls "$SLOTS") >> "$LOG"; sleep 0.3; rm "$SLOTS/$ROLE.$$""#;

/// A command that enters `$SLOTS` as `$ROLE.PID`, prints `HOLDER FENCE` and `ready`, and holds
/// until its stdin closes.
const SLOT_HELD: &str = r#"touch "$SLOTS/$ROLE.$$"; echo "$LEASEHOLD_HOLDER $LEASEHOLD_FENCE"; echo ready; read x; rm "$SLOTS/$ROLE.$$""#;

/// A command that prints `HOLDER FENCE` and `ready`, then runs until it is killed.
const HELD_FOREVER: &str = r#"echo "$LEASEHOLD_HOLDER $LEASEHOLD_FENCE"; echo ready;
    while :; do sleep 0.1 </dev/null >/dev/null 2>&1 & wait $!; done"#;

/// A permit holder's `HOLDER FENCE` line, then its `ready`.
fn holder_and_fence(p: &mut Proc) -> (String, u64) {
    let line = p.wait_for_line("HOLDER FENCE", |l| l.split(' ').count() == 2);
    p.wait_line("ready");
    let (h, f) = line.split_once(' ').unwrap();
    (h.to_owned(), f.parse().unwrap())
}

/// A scratch counter directory and log beside the store, for [`SLOT`] and [`SLOT_HELD`].
fn counter(s: &Store) -> (PathBuf, PathBuf) {
    let slots = s.path("slots");
    std::fs::create_dir_all(&slots).unwrap();
    (slots, s.path("log"))
}

/// Who is inside the counter directory.
fn inside(slots: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(slots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `leasehold run --key KEY PERMIT --ttl 5s EXTRA -- sh -c SCRIPT` with the counter's
/// environment (`ROLE`: `w` for `--write`, `r` for `--read`, else `p`).
fn permit_run(s: &Store, key: &str, permit: &[&str], extra: &[&str], script: &str) -> Command {
    let (slots, log) = counter(s);
    let role = match permit.first() {
        Some(&"--write") => "w",
        Some(&"--read") => "r",
        _ => "p",
    };
    let mut c = s.cmd(["run", "--key", key, "--ttl", "5s"]);
    c.args(permit)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .env("SLOTS", slots)
        .env("LOG", log)
        .env("ROLE", role);
    c
}

/// The counter log's lines, each the names inside when a command entered.
fn entries(log: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn n_plus_one_runs_on_a_semaphore_of_n_never_have_more_than_n_inside() {
    let s = Store::new();
    let (slots, log) = counter(&s);
    let sem = ["--permits", "2"];
    // N+1 at once, three times over: every command saw at most N inside, itself included.
    for _ in 0..3 {
        let racing: Vec<Proc> = (0..3)
            .map(|_| Proc::spawn(permit_run(&s, "slots", &sem, &[], SLOT)))
            .collect();
        for p in racing {
            let out = p.finish(LIMIT);
            assert_eq!(out.code, Some(0), "{out:?}");
        }
    }
    let seen = entries(&log);
    assert_eq!(seen.len(), 9, "{seen:?}");
    assert!(
        seen.iter().all(|e| (1..=2).contains(&e.len())),
        "more than 2 inside: {seen:?}"
    );

    // N holding: the next is refused with --no-wait, and a waiting one enters when one leaves.
    let mut a = Proc::spawn(permit_run(&s, "slots", &sem, &[], SLOT_HELD));
    let (_, fa) = holder_and_fence(&mut a);
    let mut b = Proc::spawn(permit_run(&s, "slots", &sem, &[], SLOT_HELD));
    let (_, fb) = holder_and_fence(&mut b);
    assert!(fb > fa, "a fence per permit: {fa} then {fb}");
    let out = Proc::spawn(permit_run(&s, "slots", &sem, &["--no-wait"], "true")).finish(LIMIT);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(
        out.one_stderr_line().contains("(2 of 2 permits)"),
        "{out:?}"
    );
    let mut c = Proc::spawn(permit_run(&s, "slots", &sem, &[], SLOT_HELD));
    wait_for_waiter(&s, "slots");
    assert_eq!(inside(&slots).len(), 2);
    assert_eq!(a.finish(LIMIT).code, Some(0));
    let (_, fc) = holder_and_fence(&mut c);
    assert!(fc > fb, "fences rise across permits: {fc} after {fb}");
    assert_eq!(inside(&slots).len(), 2);
    for p in [b, c] {
        assert_eq!(p.finish(LIMIT).code, Some(0));
    }
    let rec = s.inspect("slots");
    assert_eq!(rec["state"], "free", "{rec}");
    assert_eq!(fence(&rec), fc);
}

#[test]
fn readers_share_a_read_write_lock_and_a_writer_holds_it_alone() {
    let s = Store::new();
    let (slots, log) = counter(&s);
    // Readers and writers at once, twice over: a writer never saw anyone beside it, nor a
    // reader a writer.
    for _ in 0..2 {
        let racing: Vec<Proc> = ["--read", "--write", "--read", "--read", "--write", "--read"]
            .into_iter()
            .map(|p| Proc::spawn(permit_run(&s, "catalog", &[p], &[], SLOT)))
            .collect();
        for p in racing {
            let out = p.finish(LIMIT);
            assert_eq!(out.code, Some(0), "{out:?}");
        }
    }
    let seen = entries(&log);
    assert_eq!(seen.len(), 12, "{seen:?}");
    for e in &seen {
        let writers = e.iter().filter(|n| n.starts_with("w.")).count();
        assert!(
            writers == 0 || e.len() == 1,
            "a writer beside others: {seen:?}"
        );
    }

    // Two readers hold it: a writer is refused, a third reader is let in.
    let read = ["--read"];
    let write = ["--write"];
    let mut r1 = Proc::spawn(permit_run(&s, "catalog", &read, &[], SLOT_HELD));
    let (_, f1) = holder_and_fence(&mut r1);
    let mut r2 = Proc::spawn(permit_run(&s, "catalog", &read, &[], SLOT_HELD));
    let (_, f2) = holder_and_fence(&mut r2);
    let out = Proc::spawn(permit_run(&s, "catalog", &write, &["--no-wait"], "true")).finish(LIMIT);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(out.one_stderr_line().contains("(reading)"), "{out:?}");
    let out = Proc::spawn(permit_run(&s, "catalog", &read, &["--no-wait"], "true")).finish(LIMIT);
    assert_eq!(out.code, Some(0), "{out:?}");

    // A writer waits; a reader that comes after it is not let in ahead of it.
    let mut w = Proc::spawn(permit_run(&s, "catalog", &write, &[], SLOT_HELD));
    wait_for_waiter(&s, "catalog");
    let out = Proc::spawn(permit_run(&s, "catalog", &read, &["--no-wait"], "true")).finish(LIMIT);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(r1.finish(LIMIT).code, Some(0));
    assert_eq!(r2.finish(LIMIT).code, Some(0));
    let (_, fw) = holder_and_fence(&mut w);
    assert!(
        fw > f1.max(f2),
        "the writer's fence is above the reads': {fw}"
    );
    let alone = inside(&slots);
    assert!(alone.len() == 1 && alone[0].starts_with("w."), "{alone:?}");
    let out = Proc::spawn(permit_run(&s, "catalog", &read, &["--no-wait"], "true")).finish(LIMIT);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(out.one_stderr_line().contains("(writing)"), "{out:?}");
    assert_eq!(w.finish(LIMIT).code, Some(0));
    assert_eq!(s.inspect("catalog")["state"], "free");
}

#[test]
fn inspect_ls_and_watch_show_every_holder_of_a_permit_key() {
    let s = Store::new();
    let sem = ["--permits", "3"];
    let mut a = Proc::spawn(permit_run(
        &s,
        "slots",
        &sem,
        &["--label", "job=a"],
        SLOT_HELD,
    ));
    let (ha, fa) = holder_and_fence(&mut a);
    let mut b = Proc::spawn(permit_run(
        &s,
        "slots",
        &sem,
        &["--label", "job=b"],
        SLOT_HELD,
    ));
    let (hb, fb) = holder_and_fence(&mut b);

    // inspect, for people: what it is, and a line per holder with its permit's fence.
    let out = s.output(["inspect", "slots"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    for want in ["state: held", "kind: semaphore 2/3 permits held"] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "{want} in\n{}",
            out.stdout
        );
    }
    let holders: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("holder: "))
        .collect();
    assert_eq!(holders.len(), 2, "{}", out.stdout);
    assert!(holders[0].starts_with(&format!("holder: {ha} fence {fa}, expires 20")));
    assert!(holders[0].ends_with("labels job=a"), "{}", holders[0]);
    assert!(holders[1].starts_with(&format!("holder: {hb} fence {fb}, expires 20")));

    // … as JSON: the permit table, without owner tokens.
    let v = s.inspect("slots");
    assert_eq!(v["state"], "held");
    assert_eq!(v["permits"]["kind"], "semaphore");
    assert_eq!(v["permits"]["permits"], 3);
    let table = v["permits"]["holders"].as_array().unwrap();
    let seen: Vec<(String, u64)> = table.iter().map(|p| (holder(p), fence(p))).collect();
    assert_eq!(seen, [(ha.clone(), fa), (hb.clone(), fb)]);
    assert!(table
        .iter()
        .all(|p| p["state"] == "held" && p["remaining_ms"].as_u64() > Some(0)));
    assert!(
        !v.to_string().contains("token"),
        "owner tokens are not printed: {v}"
    );

    // ls: the key's row, then a row per holder.
    let out = s.output(["ls"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("slots "))
        .collect();
    assert_eq!(rows.len(), 3, "{}", out.stdout);
    assert!(rows[0].contains("semaphore 2/3 permits held") && rows[0].contains(" held "));
    assert!(rows[1].contains(&ha) && rows[1].contains(&fa.to_string()));
    assert!(rows[2].contains(&hb) && rows[2].contains(&fb.to_string()));

    // watch: one line with every holder; a third taken (by `hold`) is a change.
    let mut watch = s.spawn(["watch", "slots"]);
    let line = watch.wait_line_starting("slots held ");
    assert!(line.contains("(semaphore 2/3 permits held)"), "{line}");
    assert!(
        line.contains(&format!("holder {ha} fence {fa}"))
            && line.contains(&format!("holder {hb} fence {fb}")),
        "{line}"
    );
    let mut h = s.spawn(["hold", "--key", "slots", "--permits", "3"]);
    let held = h.wait_line_starting("held slots ");
    let hc = held.split(' ').nth(2).unwrap().to_owned();
    let line = watch.wait_line_starting("slots held ");
    assert!(line.contains("(semaphore 3/3 permits held)"), "{line}");
    assert!(line.contains(&format!("holder {hc} fence ")), "{line}");
    assert_eq!(h.finish(LIMIT).code, Some(0));
    watch.signal(libc::SIGTERM);
    assert_eq!(watch.finish(LIMIT).code, Some(0));
    for p in [a, b] {
        assert_eq!(p.finish(LIMIT).code, Some(0));
    }
    // Free once all are gone: its row says so.
    let out = s.output(["ls"]);
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("slots "))
        .collect();
    assert_eq!(rows.len(), 1, "{}", out.stdout);
    assert!(rows[0].contains("semaphore 0/3 permits held") && rows[0].contains(" free "));
}

#[test]
fn release_force_holder_frees_only_that_holder() {
    let s = Store::new();
    let sem = ["--permits", "2", "--ttl", "2s"];
    let mut a = s.spawn(["run", "--key", "slots"].iter().chain(&sem).chain(&[
        "--",
        "sh",
        "-c",
        HELD_FOREVER,
    ]));
    let (ha, fa) = holder_and_fence(&mut a);
    let mut b = s.spawn(["run", "--key", "slots"].iter().chain(&sem).chain(&[
        "--",
        "sh",
        "-c",
        HELD_FOREVER,
    ]));
    let (hb, fb) = holder_and_fence(&mut b);

    let out = s.output(["release", "--force", "slots", "--holder", "nobody"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.starts_with("nobody held nothing on \"slots\""),
        "{out:?}"
    );
    assert_eq!(
        s.inspect("slots")["permits"]["holders"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // a's permit freed: its command is stopped, b's runs on.
    let out = s.output(["release", "--force", "slots", "--holder", &ha]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout
            .starts_with("released 1 permit of the semaphore \"slots\", held by ")
            && out.stdout.contains(&format!("{ha} (fence {fa})")),
        "{out:?}"
    );
    let out = a.finish(LIMIT);
    assert_eq!(out.code, Some(76), "{out:?}");
    let rec = s.inspect("slots");
    let left: Vec<String> = rec["permits"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(holder)
        .collect();
    assert_eq!(left, std::slice::from_ref(&hb), "{rec}");
    let out = s.output(["release", "--force", "slots", "--holder", &ha]);
    assert!(out.stdout.contains("held nothing"), "{out:?}");

    // Without --holder: every permit.
    let out = s.output(["release", "--force", "slots"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains(&format!("{hb} (fence {fb})")),
        "{out:?}"
    );
    assert_eq!(b.finish(LIMIT).code, Some(76));
    assert_eq!(s.inspect("slots")["state"], "free");

    // A lock: freed for its holder only.
    let mut l = s.spawn([
        "run",
        "--key",
        "lk",
        "--ttl",
        "2s",
        "--",
        "sh",
        "-c",
        HELD_FOREVER,
    ]);
    let (hl, fl) = holder_and_fence(&mut l);
    let out = s.output(["release", "--force", "lk", "--holder", &ha]);
    assert!(out.stdout.contains("held nothing"), "{out:?}");
    assert_eq!(s.inspect("lk")["state"], "held");
    let out = s.output(["release", "--force", "lk", "--holder", &hl]);
    assert!(
        out.stdout.contains(&format!("held by {hl} (fence {fl})")),
        "{out:?}"
    );
    assert_eq!(l.finish(LIMIT).code, Some(76));
}

#[test]
fn permit_flags_are_checked() {
    let s = Store::new();
    // Counts out of range: one line, exit 2.
    for n in ["0", "65", "x"] {
        let out = s.output(["run", "--key", "k", "--permits", n, "--", "true"]);
        assert_eq!(out.code, Some(2), "{n}: {out:?}");
        assert!(out.one_stderr_line().contains("1 to 64 permits"), "{out:?}");
    }
    // Flags that exclude each other, and elect, which takes no permits: clap's usage, exit 2.
    for args in [
        &["run", "--key", "k", "--read", "--write", "--", "true"][..],
        &[
            "run",
            "--key",
            "k",
            "--permits",
            "2",
            "--read",
            "--",
            "true",
        ],
        &["hold", "--key", "k", "--permits", "2", "--write"],
        &["elect", "--key", "k", "--read"],
    ] {
        let out = s.output(args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("cannot be used with")
                || out.stderr.contains("unexpected argument"),
            "{out:?}"
        );
    }
    assert!(s.ls_json(None).is_empty());
    // A key held as one kind is refused as another, with a line that says what it is.
    let mut a = Proc::spawn(permit_run(&s, "k", &["--permits", "2"], &[], SLOT_HELD));
    holder_and_fence(&mut a);
    for other in [&["--permits", "3"][..], &["--read"], &[]] {
        let out = Proc::spawn(permit_run(&s, "k", other, &["--no-wait"], "true")).finish(LIMIT);
        assert_eq!(out.code, Some(2), "{other:?}: {out:?}");
        assert!(
            out.one_stderr_line()
                .contains("k is a semaphore of 2 permits"),
            "{out:?}"
        );
    }
    assert_eq!(a.finish(LIMIT).code, Some(0));
}
