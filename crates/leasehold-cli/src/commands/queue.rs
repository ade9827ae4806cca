//! `leasehold queue …`: add, ls, status, cancel (this file) and work (`worker.rs`).

use crate::cli::{
    PolicyArg, QueueAddArgs, QueueArgs, QueueCleanupArgs, QueueCommand, QueueLsArgs,
    QueueStatusArgs,
};
use crate::exit::{Failure, OK};
use crate::output::{self, clean, print, print_json, table};
use crate::payload::{decode_command, encode_command};
use crate::store::open_queue as open;
use leasehold::now_ms;
use leasehold::queue::{Cancelled, NewTask, Policy, QueueBackend, Status, Task, TaskEntry};
use serde_json::{json, Value};
use std::time::Duration;

/// Runs a `queue` subcommand.
pub(crate) async fn dispatch(store: Option<&str>, args: QueueArgs) -> Result<u8, Failure> {
    let queue = args.queue.as_deref();
    match args.command {
        // Checked into its words before dispatch (`crate::valid`).
        QueueCommand::Add(_) => unreachable!("queue add is checked into its words"),
        QueueCommand::Ls(a) => ls(&*open(queue).await?, a).await,
        QueueCommand::Status(a) => status(&*open(queue).await?, a).await,
        QueueCommand::Cancel(a) => cancel(&*open(queue).await?, a.id).await,
        QueueCommand::Cleanup(a) => cleanup(&*open(queue).await?, a).await,
        QueueCommand::Work(a) => {
            let queue_url = leasehold::defaults::queue_url(queue);
            let store = leasehold::defaults::worker_store_url(store, &queue_url)?;
            crate::commands::queue_work::work(open(queue).await?, Some(&store), a).await
        }
    }
}

/// `queue add`: the task of `a` running `argv` (its words, checked to be UTF-8).
pub(crate) async fn add(
    q: &dyn QueueBackend,
    a: QueueAddArgs,
    argv: Vec<String>,
) -> Result<u8, Failure> {
    let mut task = NewTask::new(a.key, encode_command(&argv));
    task.group = a.group;
    task.priority = a.priority;
    task.timeout = a.timeout;
    task.policy = match a.policy {
        PolicyArg::AtLeastOnce => Policy::AtLeastOnce {
            max_attempts: a.max_attempts,
        },
        PolicyArg::AtMostOnce => Policy::AtMostOnce,
    };
    let key = task.key.clone();
    let done = q.enqueue(&task).await?;
    if a.json {
        print_json(&json!({ "id": done.id, "position": done.position, "key": key }))?;
    } else {
        print(&format!(
            "task {} queued for {} (position {})\n",
            done.id,
            clean(&key),
            done.position
        ))?;
    }
    Ok(OK)
}

fn command_text(t: &Task) -> String {
    match decode_command(&t.payload) {
        Ok(argv) => clean(&argv.join(" ")),
        Err(e) => format!("<corrupt payload: {e}>"),
    }
}

fn task_json(t: &Task) -> Value {
    let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("payload");
        o.insert(
            "command".into(),
            decode_command(&t.payload).map_or(Value::Null, |a| json!(a)),
        );
    }
    v
}

async fn ls(q: &dyn QueueBackend, a: QueueLsArgs) -> Result<u8, Failure> {
    let all = q.list(a.all, a.limit).await?;
    if a.json {
        let rows = all
            .iter()
            .map(|e| match e {
                TaskEntry::Task(t) => task_json(t),
                TaskEntry::Corrupt { id, corrupt } => json!({ "id": id, "corrupt": corrupt }),
            })
            .collect();
        print_json(&Value::Array(rows))?;
        return Ok(OK);
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|e| match e {
            TaskEntry::Task(t) => vec![
                t.id.to_string(),
                clean(&t.key),
                t.group.as_deref().map_or_else(|| "-".into(), clean),
                if t.effective == t.priority {
                    t.priority.to_string()
                } else {
                    format!("{}→{}", t.priority, t.effective)
                },
                t.state.to_string(),
                t.attempts.to_string(),
                t.worker.as_deref().map_or_else(|| "-".into(), clean),
                output::duration(Duration::from_millis(now.saturating_sub(t.enqueued_ms))),
                command_text(t),
                t.detail.as_deref().map_or_else(String::new, clean),
            ],
            TaskEntry::Corrupt { id, corrupt } => vec![
                id.to_string(),
                "?".into(),
                "?".into(),
                "?".into(),
                "corrupt".into(),
                "?".into(),
                "?".into(),
                "?".into(),
                String::new(),
                clean(corrupt),
            ],
        })
        .collect();
    print(&table(
        &[
            "ID", "KEY", "GROUP", "PRIORITY", "STATE", "ATTEMPTS", "WORKER", "AGE", "COMMAND",
            "DETAIL",
        ],
        &rows,
    ))?;
    Ok(OK)
}

async fn status(q: &dyn QueueBackend, a: QueueStatusArgs) -> Result<u8, Failure> {
    let s = q.status().await?;
    if a.json {
        let v = serde_json::to_value(&s)
            .map_err(|e| Failure::error(format!("cannot format JSON: {e}")))?;
        print_json(&v)?;
    } else {
        print(&status_text(&s))?;
    }
    Ok(OK)
}

/// The human status report.
fn status_text(s: &Status) -> String {
    let mut out = format!(
        "pending: {} (high {}, normal {}, low {})\nrunning: {} of {} slots\nended: {} succeeded, {} failed, {} cancelled\n",
        s.pending.high + s.pending.normal + s.pending.low,
        s.pending.high,
        s.pending.normal,
        s.pending.low,
        s.running,
        s.slots,
        s.succeeded,
        s.failed,
        s.cancelled,
    );
    if s.corrupt > 0 {
        out.push_str(&format!("corrupt records: {}\n", s.corrupt));
    }
    out.push_str(&format!("workers: {}\n", s.workers.len()));
    if !s.groups.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = s
            .groups
            .iter()
            .map(|g| vec![clean(&g.name), g.pending.to_string(), g.running.to_string()])
            .collect();
        out.push_str(&table(&["GROUP", "PENDING", "RUNNING"], &rows));
    }
    if !s.keys.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = s
            .keys
            .iter()
            .map(|g| vec![clean(&g.name), g.pending.to_string(), g.running.to_string()])
            .collect();
        out.push_str(&table(&["KEY", "PENDING", "RUNNING"], &rows));
        if s.keys_total > s.keys.len() as u64 {
            out.push_str(&format!(
                "… and {} more keys\n",
                s.keys_total - s.keys.len() as u64
            ));
        }
    }
    if !s.leases.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = s
            .leases
            .iter()
            .map(|l| {
                vec![
                    clean(&l.key),
                    clean(&l.holder),
                    l.task.to_string(),
                    l.fence.map_or_else(|| "-".into(), |f| f.to_string()),
                    output::time(l.acquired_ms),
                    output::time(l.expires_ms),
                ]
            })
            .collect();
        out.push_str(&table(
            &["KEY", "HOLDER", "TASK", "FENCE", "ACQUIRED", "EXPIRES"],
            &rows,
        ));
    }
    out
}

async fn cancel(q: &dyn QueueBackend, id: u64) -> Result<u8, Failure> {
    let msg = match q.cancel(id).await? {
        Cancelled::Cancelled => format!("task {id} cancelled\n"),
        Cancelled::Requested => {
            format!("task {id} is running: its worker was asked to stop it\n")
        }
        Cancelled::AlreadyEnded(state) => format!("task {id} had already ended: {state}\n"),
    };
    print(&msg)?;
    Ok(OK)
}

async fn cleanup(q: &dyn QueueBackend, a: QueueCleanupArgs) -> Result<u8, Failure> {
    let deleted = q.cleanup(a.older_than).await?;
    if a.json {
        print(&format!("{}\n", serde_json::json!({ "deleted": deleted })))?;
    } else {
        print(&format!(
            "deleted {deleted} {} that ended at least {} ago\n",
            if deleted == 1 { "task" } else { "tasks" },
            humantime::format_duration(a.older_than)
        ))?;
    }
    Ok(OK)
}
