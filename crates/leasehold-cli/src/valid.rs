//! The command line checked before dispatch: what clap parsed (the low-level arguments) made
//! into what a command runs (the high-level ones), with every usage error (exit 2) said here, so
//! that a command never raises one itself.

use crate::cli::{
    key_arg, prefix_arg, BenchArgs, CleanupArgs, Cli, Command, ElectArgs, Fault, HoldArgs,
    QueueAddArgs, QueueArgs, QueueCommand, ReleaseArgs, RunArgs, ServeArgs, TortureArgs,
};
use crate::commands::torture::servers::{Source, StoreKind};
use crate::commands::torture::{network, Mode};
use crate::exit::Failure;
use crate::process::loss::Loss;
use leasehold::Key;
use std::ffi::OsString;
use std::time::Duration;

/// A command line that passed every check.
#[derive(Debug)]
pub(crate) struct Valid {
    /// `--store` (or `LEASEHOLD_STORE`).
    pub(crate) store: Option<String>,
    pub(crate) command: Checked,
}

/// A command, checked.
#[derive(Debug)]
pub(crate) enum Checked {
    /// `run`: the lease, and the program to run (its arguments left in `args.command`).
    Run {
        args: RunArgs,
        held: Held,
        program: OsString,
    },
    Hold(HoldArgs, Held),
    Elect(ElectArgs, Held),
    Torture(TorturePlan),
    /// `ls`: the keys under `prefix`.
    Ls {
        prefix: String,
        json: bool,
    },
    /// `inspect KEY`.
    Inspect {
        key: Key,
        json: bool,
    },
    /// `watch KEY`.
    Watch {
        key: Key,
        json: bool,
        every: Duration,
    },
    /// `release --force KEY [--holder ID]`.
    Release {
        key: Key,
        holder: Option<String>,
    },
    /// `serve`: the keys under `prefix`, and the token of `--token-file` when given.
    Serve {
        args: ServeArgs,
        prefix: String,
        token: Option<String>,
    },
    /// `bench`, with at least one task per run.
    Bench(BenchArgs),
    /// `queue add`, its command's words in UTF-8.
    QueueAdd {
        queue: Option<String>,
        args: QueueAddArgs,
        argv: Vec<String>,
    },
    /// `cleanup`.
    Cleanup(CleanupArgs),
    /// A `queue` command other than `add`.
    Queue(QueueArgs),
}

impl Valid {
    /// Checks `cli`.
    ///
    /// # Errors
    /// A usage error saying what is wrong.
    pub(crate) fn check(cli: Cli) -> Result<Valid, Failure> {
        let store = cli.store;
        let command = match cli.command {
            Command::Run(args) => check_run(args)?,
            Command::Hold(args) => {
                // The script is told `stop` at the stop-by deadline, as `run` would send SIGTERM.
                let lease = &args.lease;
                let held = Held::check(&lease.key, lease.ttl, lease.loss_grace, Duration::ZERO)?;
                Checked::Hold(args, held)
            }
            Command::Elect(args) => {
                let held = Held::check(&args.key, args.ttl, args.loss_grace, args.overlap_grace)?;
                Checked::Elect(args, held)
            }
            Command::Torture(args) => Checked::Torture(TorturePlan::check(store.as_deref(), args)?),
            Command::Ls(args) => Checked::Ls {
                prefix: prefix_arg(args.prefix.as_deref())?,
                json: args.json,
            },
            Command::Inspect(args) => Checked::Inspect {
                key: key_arg(&args.key)?,
                json: args.json,
            },
            Command::Watch(args) => Checked::Watch {
                key: key_arg(&args.key)?,
                json: args.json,
                every: args.every,
            },
            Command::Release(args) => check_release(args)?,
            Command::Serve(args) => check_serve(args)?,
            Command::Bench(args) => check_bench(args)?,
            Command::Queue(QueueArgs {
                queue,
                command: QueueCommand::Add(args),
            }) => Checked::QueueAdd {
                argv: utf8_words(&args.command)?,
                queue,
                args,
            },
            Command::Queue(args) => Checked::Queue(args),
            Command::Cleanup(args) => Checked::Cleanup(args),
        };
        Ok(Valid { store, command })
    }
}

/// `run`: the lease, and a command to run under it.
fn check_run(mut args: RunArgs) -> Result<Checked, Failure> {
    let lease = &args.lease;
    let held = Held::check(&lease.key, lease.ttl, lease.loss_grace, args.overlap_grace)?;
    if args.command.is_empty() {
        return Err(Failure::usage(
            "no command to run: leasehold run --key KEY -- CMD [ARGS...]",
        ));
    }
    let program = args.command.remove(0);
    Ok(Checked::Run {
        args,
        held,
        program,
    })
}

/// `release` needs `--force`: only the holder releases a lease otherwise.
fn check_release(args: ReleaseArgs) -> Result<Checked, Failure> {
    if !args.force {
        return Err(Failure::usage(
            "only the holder releases a lease (its `leasehold run` does when the command exits); \
             to free it whoever holds it, use `leasehold release --force KEY`",
        ));
    }
    Ok(Checked::Release {
        key: key_arg(&args.key)?,
        holder: args.holder,
    })
}

/// `serve`: its prefix, and the token of `--token-file` when force release is allowed.
fn check_serve(args: ServeArgs) -> Result<Checked, Failure> {
    Ok(Checked::Serve {
        prefix: prefix_arg(args.prefix.as_deref())?,
        token: match (args.allow_force_release, &args.token_file) {
            (true, Some(path)) => Some(read_token(path)?),
            _ => None,
        },
        args,
    })
}

/// `bench`: at least one task per run.
fn check_bench(args: BenchArgs) -> Result<Checked, Failure> {
    if args.tasks.is_empty() || args.tasks.contains(&0) {
        return Err(Failure::usage(
            "--tasks takes counts of 1 or more, e.g. 1,8,64",
        ));
    }
    Ok(Checked::Bench(args))
}

/// The lease `run`, `hold` and `elect` take: its key, and how its loss stops what runs under it.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) key: Key,
    pub(crate) loss: Loss,
    /// The loss grace to ask the library for.
    pub(crate) lease_loss_grace: Duration,
}

impl Held {
    /// The lease on `key` of `ttl`, its `--loss-grace` (`given`) checked to fit it, with
    /// `--overlap-grace`.
    fn check(
        key: &std::ffi::OsStr,
        ttl: Duration,
        given: Option<Duration>,
        overlap: Duration,
    ) -> Result<Held, Failure> {
        let key = key_arg(key)?;
        let (loss, lease_loss_grace) = Loss::for_lease(ttl, given, overlap)?;
        Ok(Held {
            key,
            loss,
            lease_loss_grace,
        })
    }
}

/// The token in `path`: its first line, trimmed.
fn read_token(path: &std::path::Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read --token-file {}: {e}", path.display())))?;
    let token = text.lines().next().unwrap_or_default().trim();
    if token.len() < 16 {
        return Err(Failure::usage(format!(
            "the token in {} is shorter than 16 characters",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// A command's words, each in UTF-8 (a queued task's command is stored as text).
fn utf8_words(words: &[OsString]) -> Result<Vec<String>, Failure> {
    words
        .iter()
        .map(|s| {
            s.to_str().map(str::to_owned).ok_or_else(|| {
                Failure::usage(format!(
                    "command argument {:?} is not valid UTF-8",
                    s.to_string_lossy()
                ))
            })
        })
        .collect()
}

/// A `torture` run: its options, the store it runs on, what its keys are, and its seed.
#[derive(Debug)]
pub(crate) struct TorturePlan {
    pub(crate) args: TortureArgs,
    pub(crate) source: Source,
    pub(crate) mode: Mode,
    /// `--seed`, else a random one.
    pub(crate) seed: u64,
}

impl TorturePlan {
    /// Checks `torture`'s options, with `url` from `--store`.
    ///
    /// # Errors
    /// A usage error: counts too low, a mode the clients cannot test, a kind whose servers are
    /// not started here without `--store`, a fault the store cannot take.
    fn check(url: Option<&str>, args: TortureArgs) -> Result<TorturePlan, Failure> {
        check_counts(&args)?;
        let mode = check_mode(&args)?;
        let source = check_source(url, &args.kind)?;
        check_faults(&source, &args)?;
        Ok(TorturePlan {
            seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
            args,
            source,
            mode,
        })
    }
}

/// At least one client and one key, and a TTL of at least 100 ms.
fn check_counts(args: &TortureArgs) -> Result<(), Failure> {
    if args.clients == 0 || args.keys == 0 || args.ttl < Duration::from_millis(100) {
        return Err(Failure::usage(
            "--clients and --keys must be at least 1, --ttl at least 100ms",
        ));
    }
    Ok(())
}

/// The keys' mode, where the clients can fail it: more clients than permits, two to meet.
fn check_mode(args: &TortureArgs) -> Result<Mode, Failure> {
    let mode = Mode::of(args);
    match mode {
        Mode::Semaphore(n) if usize::try_from(n).map_or(true, |n| n >= args.clients) => {
            Err(Failure::usage(format!(
                "--permits {n} needs more --clients than permits (now {}): with no more clients than permits, none is ever refused and nothing is checked",
                args.clients
            )))
        }
        Mode::ReadWrite if args.clients < 2 => Err(Failure::usage(
            "--read-write needs at least 2 --clients: one alone never meets another",
        )),
        _ => Ok(mode),
    }
}

/// The store: `url` when given (`kind` then only names it), else a kind whose servers this
/// build starts.
fn check_source(url: Option<&str>, kind: &str) -> Result<Source, Failure> {
    if let Some(u) = url {
        return Ok(Source::Given(u.to_owned()));
    }
    let Some(k) = StoreKind::parse(kind) else {
        return Err(Failure::usage(format!(
            "torture {kind} needs --store URL of a server you run (started here: {})",
            StoreKind::names()
        )));
    };
    if k.launchable() {
        Ok(Source::Started(k))
    } else if cfg!(feature = "torture") {
        Err(Failure::usage(format!(
            "this leasehold was built without the store of torture {kind}"
        )))
    } else {
        Err(Failure::usage(format!(
            "torture {kind} starts its servers itself, and this leasehold was built without its server launchers (the `torture` feature): pass --store URL of a server you run, or install leasehold with its default features"
        )))
    }
}

/// The faults the store can take: `restart` needs servers started here; `partition` and
/// `lost-answer` a store its proxies can stand in front of, and `lost-answer` a URL whose
/// `timeout=` reads.
fn check_faults(source: &Source, args: &TortureArgs) -> Result<(), Failure> {
    if args.faults.contains(&Fault::Restart) && !source.restartable() {
        return Err(Failure::usage(format!(
            "the restart fault needs a server started here (not --store URL, not {})",
            args.kind
        )));
    }
    let url = match source {
        Source::Given(u) => u.as_str(),
        Source::Started(k) => k.row().url_form,
    };
    for fault in &args.faults {
        if matches!(fault, Fault::Partition | Fault::LostAnswer) {
            network::proxiable(url, fault.as_str()).map_err(Failure::usage)?;
        }
        if *fault == Fault::LostAnswer {
            network::url_timeout(url).map_err(|e| Failure::usage(format!("{fault}: {e}")))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `leasehold torture ARGS`, checked.
    fn torture(args: &str) -> Result<TorturePlan, Failure> {
        let cli = Cli::try_parse_from(format!("leasehold torture {args}").split(' '))
            .map_err(|e| Failure::usage(e.to_string()))?;
        match Valid::check(cli)?.command {
            Checked::Torture(plan) => Ok(plan),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn torture_refuses_what_its_clients_cannot_test_before_it_starts() {
        for (args, says) in [
            ("file --clients 0", "--clients and --keys"),
            ("file --ttl 50ms", "--ttl at least 100ms"),
            ("file --permits 5", "needs more --clients"),
            ("file --read-write --clients 1", "at least 2 --clients"),
            ("nosuch", "torture nosuch needs --store URL"),
            ("file --faults none,restart", "restart fault needs a server"),
            (
                "redis --store redis://127.0.0.1:1 --faults restart",
                "not --store URL, not redis",
            ),
            (
                "memory --faults lost-answer",
                "lost-answer needs a store reached over TCP",
            ),
            (
                "redis-sentinel --faults partition",
                "cannot proxy redis+sentinel:// stores",
            ),
            (
                "x --store redis://127.0.0.1:1/0?timeout=soon --faults lost-answer",
                "lost-answer: the store URL's timeout=soon",
            ),
        ] {
            let e = torture(args).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{args}: {e}");
            assert!(e.message.contains(says), "{args}: {e}");
        }
        let plan = torture("unusable --store nosuch://x --seed 7").unwrap();
        assert_eq!(plan.source, Source::Given("nosuch://x".into()));
        assert_eq!(plan.seed, 7);
        let plan = torture("redis --faults partition,lost-answer,restart --permits 2").unwrap();
        assert_eq!(plan.source, Source::Started(StoreKind::Redis));
        assert_eq!(plan.mode, Mode::Semaphore(2));
    }

    #[test]
    fn usage_errors_of_other_commands_are_said_before_dispatch() {
        for (args, says) in [
            ("release k", "only the holder releases a lease"),
            ("bench --tasks 1,0", "--tasks takes counts of 1 or more"),
            ("inspect", ""),
        ] {
            let parsed = Cli::try_parse_from(format!("leasehold {args}").split(' '));
            let Ok(cli) = parsed else {
                assert!(says.is_empty(), "{args}: clap refused it");
                continue;
            };
            let e = Valid::check(cli).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{args}: {e}");
            assert!(e.message.contains(says), "{args}: {e}");
        }
        for args in [
            "run --key k --ttl 2s --loss-grace 5s -- true",
            "hold --key k --ttl 2s --loss-grace 5s",
            "elect --key k --ttl 2s --loss-grace 5s",
        ] {
            let cli = Cli::try_parse_from(format!("leasehold {args}").split(' ')).unwrap();
            let e = Valid::check(cli).unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{args}: {e}");
            assert!(e.message.contains("does not fit a 2s lease"), "{args}: {e}");
        }
        let cli =
            Cli::try_parse_from(["leasehold", "run", "--key", "k", "--", "echo", "hi"]).unwrap();
        let Checked::Run { args, program, .. } = Valid::check(cli).unwrap().command else {
            panic!("not run")
        };
        assert_eq!(
            (program.to_str(), args.command),
            (Some("echo"), vec!["hi".into()])
        );
        let cli = Cli::try_parse_from(["leasehold", "inspect", ""]).unwrap();
        assert_eq!(Valid::check(cli).unwrap_err().code, crate::exit::USAGE);
        let cli = Cli::try_parse_from(["leasehold", "release", "--force", "k"]).unwrap();
        assert!(matches!(
            Valid::check(cli).unwrap().command,
            Checked::Release { .. }
        ));
    }

    #[test]
    fn a_queued_command_must_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0x66, 0xff]);
        let e = utf8_words(&["ok".into(), bad]).unwrap_err();
        assert_eq!(e.code, crate::exit::USAGE);
        assert!(e.message.contains("is not valid UTF-8"), "{e}");
        assert_eq!(utf8_words(&["a".into(), "b".into()]).unwrap(), ["a", "b"]);
    }
}
