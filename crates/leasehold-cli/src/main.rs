//! `leasehold`: run a command under a distributed lock; list, inspect, force-release and clean
//! up leases. A thin layer over the `leasehold` library; `leasehold --help` documents it.

// The commands: `app` dispatches to them (and `queue` to `worker`, its `work`). A command imports
// helpers only, never another command.
mod admin;
mod app;
mod bench;
mod elect;
mod hold;
mod queue;
mod run;
mod torture;
mod worker;

// The helpers. None imports a command, and their imports have no cycle: `leased` (a command
// under a lease) → `loss` (when it is stopped), `holding` (taking and holding one) → `child` (a process) → `signals`, `exit`;
// `supervise` and `guard` are also the hidden processes `main` starts.
mod child;
mod cli;
mod exit;
mod guard;
mod holding;
mod leased;
mod loss;
mod metrics;
mod output;
mod payload;
mod setup;
mod signals;
mod store;
mod supervise;
mod tree;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == guard::ARG) {
        return guard::main();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == supervise::ARG)
    {
        return supervise::main();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == torture::ARG)
    {
        return torture::main();
    }
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(exit::clap_error(&e)),
    };
    setup::init_logging();
    ExitCode::from(app::main(cli))
}
