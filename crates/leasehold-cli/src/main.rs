//! `leasehold`: run a command under a distributed lock; list, inspect, force-release and clean
//! up leases. A thin layer over the `leasehold` library; `leasehold --help` documents it.

mod app;
mod cli;
mod commands;
mod exit;
mod follow;
mod lease;
mod metrics;
mod output;
mod payload;
mod process;
mod progress;
mod records;
mod setup;
mod store;
mod valid;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == process::group_guard::ARG)
    {
        return process::group_guard::main();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == process::supervise::ARG)
    {
        return process::supervise::main();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == commands::torture::ARG)
    {
        return commands::torture::main();
    }
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(exit::clap_error(&e)),
    };
    setup::init_logging();
    ExitCode::from(app::main(cli))
}
