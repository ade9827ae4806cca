//! `leasehold`: run a command under a distributed lock; list, inspect, force-release and clean
//! up leases. A thin layer over the `leasehold` library; `leasehold --help` documents it.

mod admin;
mod app;
mod bench;
mod cli;
mod elect;
mod exit;
mod guard;
mod hold;
mod metrics;
mod output;
mod queue;
mod run;
mod signals;
mod store;
mod supervise;
mod tree;
mod worker;

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
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(exit::clap_error(&e)),
    };
    app::init_logging();
    ExitCode::from(app::main(cli))
}
