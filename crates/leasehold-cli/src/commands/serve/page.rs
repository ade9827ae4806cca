//! The page's HTML, rendered here for the first load (usable without JavaScript) and for every
//! live update (the script swaps the sections in). Everything the store or the queue says —
//! keys, holders, task keys, error messages — is hostile input: it goes through [`text`].

use super::look::Look;
use crate::output::{self, clean};
use crate::records::{state, waiter};
use leasehold::queue::Status;
use leasehold::{Inspection, LeaseRecord, Permits};
use std::fmt::Write as _;
use std::time::Duration;

/// The page, with its placeholders.
const PAGE: &str = include_str!("page.html");

/// What the page shows besides the look: where it looks.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The store's URL, redacted.
    pub(crate) store: String,
    /// The queue's URL, redacted.
    pub(crate) queue: String,
    /// The keys' prefix.
    pub(crate) prefix: String,
    /// Whether the page offers force release.
    pub(crate) release: bool,
}

/// A string as HTML text or attribute value: `&<>"'` escaped, control characters written as
/// escapes (a key stays on its line).
pub(crate) fn text(s: &str) -> String {
    let s = clean(s);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The whole page at `now` (Unix ms).
pub(crate) fn page(cx: &Context, look: &Look, now: u64) -> String {
    let prefix = if cx.prefix.is_empty() {
        "all keys".to_owned()
    } else {
        format!("keys under <code>{}</code>", text(&cx.prefix))
    };
    let release = if cx.release {
        r#"<label class="token">Force-release token <input type="password" id="token" autocomplete="off"></label>"#
    } else {
        ""
    };
    PAGE.replace("{{store}}", &text(&cx.store))
        .replace("{{queue_url}}", &text(&cx.queue))
        .replace("{{prefix}}", &prefix)
        .replace("{{release}}", release)
        .replace("{{leases}}", &leases(cx, look, now))
        .replace("{{queue}}", &queue(cx, look, now))
}

/// A countdown the script keeps running: the time left at `now`, in a `<span>` that carries it
/// in milliseconds.
fn countdown(ms: u64) -> String {
    format!(
        r#"<span class="countdown" data-ms="{ms}">{}</span>"#,
        output::duration(Duration::from_millis(ms))
    )
}

/// The leases section's content.
pub(crate) fn leases(cx: &Context, look: &Look, now: u64) -> String {
    let all = match &look.leases {
        Ok(all) => all,
        Err(e) => {
            return format!(
                r#"<p class="error">The store did not answer: {}</p>"#,
                text(e)
            )
        }
    };
    // Free records (kept by some stores after a release) are no leases: counted, not listed.
    let shown: Vec<&Inspection> = all.iter().filter(|i| !is_free(i, now)).collect();
    let free = all.len() - shown.len();
    let note = match free {
        0 => String::new(),
        n => format!(
            "\n<p class=\"note\" id=\"free\">{n} free {} not shown (kept by the store after a \
             release; <code>leasehold ls</code> and <code>/api/leases</code> list {}).</p>",
            if n == 1 { "record" } else { "records" },
            if n == 1 { "it" } else { "them" },
        ),
    };
    if shown.is_empty() {
        return format!(r#"<p class="empty">No lease held.</p>{note}"#);
    }
    let mut out = String::from(
        "<table id=\"leases\"><thead><tr><th>Key</th><th>Holder</th><th>Fence</th>\
         <th>Expires in</th><th>Waiters in line</th>",
    );
    if cx.release {
        out.push_str("<th></th>");
    }
    out.push_str("</tr></thead><tbody>\n");
    for i in shown {
        match i {
            Inspection::Record(r) => record_rows(cx, r, now, &mut out),
            Inspection::Corrupt { name, detail } => {
                let _ = writeln!(
                    out,
                    r#"<tr class="corrupt" data-key="{}"><td class="key">{}</td><td colspan="4">corrupt: {}</td>{}</tr>"#,
                    text(name),
                    text(name),
                    text(detail),
                    if cx.release { "<td></td>" } else { "" }
                );
            }
        }
    }
    out.push_str("</tbody></table>");
    out.push_str(&note);
    out
}

/// Whether `i` is a free record nobody waits for.
fn is_free(i: &Inspection, now: u64) -> bool {
    match i {
        Inspection::Record(r) => state(r, now) == "free" && waiters(r, now) == "-",
        Inspection::Corrupt { .. } => false,
    }
}

/// The waiters in line on `r` at `now`: the registered waiter, then the queue's live places.
fn waiters(r: &LeaseRecord, now: u64) -> String {
    let mut names: Vec<String> = waiter(r, now).into_iter().collect();
    names.extend(
        r.queue
            .iter()
            .filter(|w| w.expires_ms > now && r.waiter_token.as_deref() != Some(&w.token))
            .map(|w| w.holder.clone()),
    );
    if names.is_empty() {
        return "-".into();
    }
    let count = names.len();
    format!(
        r#"<span class="count">{count}</span> {}"#,
        text(&names.join(", "))
    )
}

/// The release button of a key (for one holder's permits when `holder` is given).
fn release_cell(cx: &Context, key: &str, holder: Option<&str>, held: bool) -> String {
    if !cx.release {
        return String::new();
    }
    if !held {
        return "<td></td>".into();
    }
    let holder = holder.map_or_else(String::new, |h| format!(r#" data-holder="{}""#, text(h)));
    format!(
        r#"<td><button class="release" data-key="{}"{holder} disabled>release</button></td>"#,
        text(key)
    )
}

/// A record's rows: one for a lock; for a semaphore or read-write key one that says what it is
/// and how many hold it, then one per permit.
fn record_rows(cx: &Context, r: &LeaseRecord, now: u64, out: &mut String) {
    let st = state(r, now);
    let key = text(&r.key);
    if let Some(t) = &r.permits {
        permit_rows(cx, r, t, now, out);
        return;
    }
    let holder = match (&r.holder, st) {
        (Some(h), "held" | "expired") => text(h),
        _ => "-".into(),
    };
    let expires = match st {
        "held" => countdown(duration_ms(r.remaining(now))),
        other => other.into(),
    };
    let _ = writeln!(
        out,
        r#"<tr class="{st}" data-key="{key}"><td class="key">{key}</td><td class="holder">{holder}</td><td class="fence">{}</td><td class="expires">{expires}</td><td class="waiters">{}</td>{}</tr>"#,
        r.fence,
        waiters(r, now),
        release_cell(cx, &r.key, None, st == "held"),
    );
}

fn permit_rows(cx: &Context, r: &LeaseRecord, t: &Permits, now: u64, out: &mut String) {
    let st = state(r, now);
    let key = text(&r.key);
    let _ = writeln!(
        out,
        r#"<tr class="{st} permits" data-key="{key}"><td class="key">{key}</td><td class="holder">{}</td><td class="fence">{}</td><td class="expires">{st}</td><td class="waiters">{}</td>{}</tr>"#,
        text(&output::permits_summary(t, now)),
        r.fence,
        waiters(r, now),
        release_cell(cx, &r.key, None, st == "held"),
    );
    for p in &t.holders {
        let live = p.expires_ms > now;
        let expires = if live {
            countdown(p.expires_ms - now)
        } else {
            "expired".into()
        };
        let _ = writeln!(
            out,
            r#"<tr class="permit {}" data-key="{key}"><td class="key sub">{key}</td><td class="holder">{}</td><td class="fence">{}</td><td class="expires">{expires}</td><td></td>{}</tr>"#,
            if live { "held" } else { "expired" },
            text(&output::permit_holder(t, p)),
            p.fence,
            release_cell(cx, &r.key, Some(&p.holder), live),
        );
    }
}

/// The queue section's content.
pub(crate) fn queue(cx: &Context, look: &Look, now: u64) -> String {
    match &look.queue {
        None => format!(
            r#"<p class="empty" id="no-queue">{}</p>"#,
            text(&no_queue(cx))
        ),
        Some(Ok(s)) => status(s, now),
        Some(Err(e)) => format!(
            r#"<p class="error">The queue did not answer: {}</p>"#,
            text(e)
        ),
    }
}

/// What the page and `/api/queue` say while the default queue does not exist.
pub(crate) fn no_queue(cx: &Context) -> String {
    format!(
        "No queue: the default queue {} does not exist yet (`leasehold queue add` creates it; \
         name another with --queue)",
        cx.queue
    )
}

fn status(s: &Status, now: u64) -> String {
    let p = &s.pending;
    let mut out = format!(
        "<dl class=\"summary\"><dt>Slots used</dt><dd id=\"slots\">{} of {}</dd>\
         <dt>Pending</dt><dd id=\"pending\">high {}, normal {}, low {}</dd>\
         <dt>Ended</dt><dd>{} succeeded, {} failed, {} cancelled</dd>\
         <dt>Workers</dt><dd>{}</dd></dl>\n",
        s.running,
        s.slots,
        p.high,
        p.normal,
        p.low,
        s.succeeded,
        s.failed,
        s.cancelled,
        s.workers.len()
    );
    if s.corrupt > 0 {
        let _ = writeln!(
            out,
            r#"<p class="error">Corrupt task records: {}</p>"#,
            s.corrupt
        );
    }
    if s.leases.is_empty() {
        out.push_str(r#"<p class="empty">No task running.</p>"#);
    } else {
        out.push_str(
            "<table id=\"running\"><thead><tr><th>Task</th><th>Key</th><th>Worker</th>\
             <th>Fence</th><th>Claim expires in</th></tr></thead><tbody>\n",
        );
        for l in &s.leases {
            let _ = writeln!(
                out,
                r#"<tr><td>{}</td><td class="key">{}</td><td class="holder">{}</td><td class="fence">{}</td><td>{}</td></tr>"#,
                l.task,
                text(&l.key),
                text(&l.holder),
                l.fence.map_or_else(|| "-".into(), |f| f.to_string()),
                if l.expires_ms > now {
                    countdown(l.expires_ms - now)
                } else {
                    "expired".into()
                },
            );
        }
        out.push_str("</tbody></table>");
    }
    if !s.keys.is_empty() {
        out.push_str(
            "\n<table id=\"keys\"><thead><tr><th>Key</th><th>Pending</th><th>Running</th></tr></thead><tbody>\n",
        );
        for k in &s.keys {
            let _ = writeln!(
                out,
                r#"<tr><td class="key">{}</td><td>{}</td><td>{}</td></tr>"#,
                text(&k.name),
                k.pending,
                k.running
            );
        }
        out.push_str("</tbody></table>");
        if s.keys_total > s.keys.len() as u64 {
            let _ = write!(
                out,
                "<p>… and {} more keys</p>",
                s.keys_total - s.keys.len() as u64
            );
        }
    }
    out
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_strings_are_text() {
        assert_eq!(
            text("<script>alert('x')&\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;)&amp;&quot;&lt;/script&gt;"
        );
        assert_eq!(text("a\nb"), "a\\nb");
    }

    #[test]
    fn a_held_key_has_its_row() {
        let now = 1_790_000_000_000;
        let mut r = LeaseRecord::free("<img src=x onerror=alert(1)>", 7);
        r.holder = Some("h\"><b>".into());
        r.token = Some("t".into());
        r.expires_ms = now + 5_000;
        let look = Look {
            leases: Ok(vec![Inspection::Record(r)]),
            queue: Some(Ok(Status::default())),
        };
        let cx = Context {
            store: "memory://".into(),
            queue: "sqlite:///q".into(),
            prefix: String::new(),
            release: true,
        };
        let html = leases(&cx, &look, now);
        assert!(!html.contains("<img") && !html.contains("<b>"), "{html}");
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;"),
            "{html}"
        );
        assert!(html.contains(r#"data-ms="5000">5.0s<"#), "{html}");
        assert!(html.contains(r#"<td class="fence">7</td>"#), "{html}");
        assert!(page(&cx, &look, now).contains("No task running."));
    }
}
