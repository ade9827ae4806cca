//! The subcommands: `app` dispatches to them (and `queue` to `queue_work`, its `work`). A command
//! imports helpers only, never another command.

pub(crate) mod admin;
pub(crate) mod bench;
mod bench_plot;
pub(crate) mod elect;
pub(crate) mod hold;
pub(crate) mod queue;
pub(crate) mod queue_work;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod torture;
