//! Processes: a command's child process and its signals, the process tree and its sweeps, a
//! command run under a lease and when it is stopped, and the two hidden processes `main` starts
//! (the group guard, the task supervisor). Their imports have no cycle: `under_lease` (a command
//! under a lease) → `loss` (when it is stopped) and `child` (a process) → `signals`.

pub(crate) mod child;
pub(crate) mod group_guard;
pub(crate) mod loss;
pub(crate) mod signals;
pub(crate) mod supervise;
pub(crate) mod tree;
pub(crate) mod under_lease;
