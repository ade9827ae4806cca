//! A task row as the backends read it: the raw columns, their parsing into a [`Task`] (or the
//! reason the record is corrupt), and the conversions between Rust values and the columns' types.

use super::{CancelReason, Outcome, Policy, Priority, Task, TaskEntry, TaskState};
use std::str::FromStr;
use std::time::Duration;

/// Raw columns of a task row, shared by the backends' row readers.
#[derive(Debug, Default)]
pub(crate) struct RawTask {
    pub(crate) id: i64,
    pub(crate) key: String,
    pub(crate) grp: Option<String>,
    pub(crate) priority: String,
    pub(crate) rank: i64,
    pub(crate) payload: String,
    pub(crate) state: String,
    pub(crate) policy: String,
    pub(crate) max_attempts: i64,
    pub(crate) attempts: i64,
    pub(crate) timeout_ms: Option<i64>,
    pub(crate) enqueued_ms: i64,
    pub(crate) started_ms: Option<i64>,
    pub(crate) ended_ms: Option<i64>,
    pub(crate) worker: Option<String>,
    pub(crate) fence: Option<i64>,
    pub(crate) lease_expires_ms: Option<i64>,
    pub(crate) cancel: i64,
    pub(crate) detail: Option<String>,
}

/// The columns in [`RawTask`] order, for SELECTs.
pub(crate) const COLUMNS: &str = "id, key, grp, priority, rank, payload, state, policy, \
     max_attempts, attempts, timeout_ms, enqueued_ms, started_ms, ended_ms, worker, fence, \
     lease_expires_ms, cancel, detail";

/// Cancel request codes as stored.
pub(crate) const CANCEL_NONE: i64 = 0;
pub(crate) const CANCEL_REQUESTED: i64 = 1;
pub(crate) const CANCEL_TIMEOUT: i64 = 2;

fn opt_u64(v: Option<i64>, what: &str) -> std::result::Result<Option<u64>, String> {
    v.map(|x| u64::try_from(x).map_err(|_| format!("negative {what} {x}")))
        .transpose()
}

impl RawTask {
    /// The task, or what makes the record corrupt.
    pub(crate) fn parse(self) -> TaskEntry {
        let id = u64::try_from(self.id).unwrap_or(0);
        match self.try_parse() {
            Ok(t) => TaskEntry::Task(t),
            Err(corrupt) => TaskEntry::Corrupt { id, corrupt },
        }
    }

    fn try_parse(self) -> std::result::Result<Task, String> {
        let state = TaskState::parse(&self.state)
            .ok_or_else(|| format!("unknown state {:?}", self.state))?;
        let priority = Priority::from_str(&self.priority)
            .map_err(|_| format!("unknown priority {:?}", self.priority))?;
        let effective =
            Priority::from_rank(self.rank).ok_or_else(|| format!("bad rank {}", self.rank))?;
        let policy = Policy::from_parts(&self.policy, self.max_attempts)
            .ok_or_else(|| format!("bad policy {:?}/{}", self.policy, self.max_attempts))?;
        crate::key::Key::new(&self.key).map_err(|e| format!("bad key: {e}"))?;
        let cancel = match self.cancel {
            CANCEL_NONE => None,
            CANCEL_REQUESTED => Some(CancelReason::Cancelled),
            CANCEL_TIMEOUT => Some(CancelReason::Timeout),
            other => return Err(format!("bad cancel code {other}")),
        };
        Ok(Task {
            id: u64::try_from(self.id).map_err(|_| format!("bad id {}", self.id))?,
            key: self.key,
            group: self.grp,
            priority,
            effective,
            payload: self.payload,
            state,
            policy,
            attempts: u32::try_from(self.attempts)
                .map_err(|_| format!("bad attempts {}", self.attempts))?,
            timeout_ms: opt_u64(self.timeout_ms, "timeout")?,
            enqueued_ms: u64::try_from(self.enqueued_ms)
                .map_err(|_| format!("bad enqueue time {}", self.enqueued_ms))?,
            started_ms: opt_u64(self.started_ms, "start time")?,
            ended_ms: opt_u64(self.ended_ms, "end time")?,
            worker: self.worker,
            fence: opt_u64(self.fence, "fence")?,
            lease_expires_ms: opt_u64(self.lease_expires_ms, "lease expiry")?,
            cancel,
            detail: self.detail,
        })
    }
}

/// Task ids as the databases store them (`BIGINT`, `INTEGER`); an id past `i64` names no task
/// and is left out.
pub(crate) fn ids_i64(ids: &[u64]) -> Vec<i64> {
    ids.iter()
        .filter_map(|id| i64::try_from(*id).ok())
        .collect()
}

/// Milliseconds as the i64 the databases store.
pub(crate) fn ms_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Now in Unix ms as i64.
pub(crate) fn now_i64() -> i64 {
    i64::try_from(crate::record::now_ms()).unwrap_or(i64::MAX)
}

/// An outcome's stored state and detail.
pub(crate) fn outcome_parts(o: &Outcome) -> (&'static str, Option<&str>) {
    match o {
        Outcome::Succeeded => ("succeeded", None),
        Outcome::Failed(why) => ("failed", Some(why)),
        Outcome::Cancelled(why) => ("cancelled", Some(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_rows_are_reported_not_fatal() {
        let raw = RawTask {
            id: 7,
            state: "exploded".into(),
            ..RawTask::default()
        };
        match raw.parse() {
            TaskEntry::Corrupt { id, corrupt } => {
                assert_eq!(id, 7);
                assert!(corrupt.contains("exploded"), "{corrupt}");
            }
            other => panic!("{other:?}"),
        }
    }
}
