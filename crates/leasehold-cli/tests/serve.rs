//! `leasehold serve` as a user meets it: the binary on a free port over a `file://` store and a
//! SQLite queue in temp dirs (and a real Redis from the test kit), leases taken with the
//! library, the JSON, the event stream and force release checked over HTTP, and the page in a
//! real headless chromium (Debian's, through chromedriver).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "serve/http.rs"]
mod http;
#[path = "serve/webdriver.rs"]
mod webdriver;

use http::{get, request, Events};
use leasehold::{LeaseGuard as Guard, Locks};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
/// How long a condition may take to hold before the test fails.
const BOUND: Duration = Duration::from_secs(20);

/// A running `leasehold serve`.
struct Serve {
    child: Child,
    port: u16,
    token: Option<String>,
}

impl Serve {
    /// Starts `leasehold --store STORE serve --queue QUEUE --listen 127.0.0.1:0 EXTRA…` and reads
    /// its address (and token) from stdout.
    fn start(store: &str, queue: &str, extra: &[&str]) -> Serve {
        let mut cmd = Command::new(BIN);
        cmd.args(["--store", store, "serve", "--queue", queue]);
        Self::spawn(cmd, extra)
    }

    /// Starts `leasehold --store STORE serve --listen 127.0.0.1:0 EXTRA…` with no queue named and
    /// `state` as the state directory (`XDG_STATE_HOME`), where the default queue is.
    fn start_with_default_queue(store: &str, state: &std::path::Path, extra: &[&str]) -> Serve {
        let mut cmd = Command::new(BIN);
        cmd.args(["--store", store, "serve"])
            .env_remove("LEASEHOLD_QUEUE")
            .env("XDG_STATE_HOME", state);
        Self::spawn(cmd, extra)
    }

    fn spawn(mut cmd: Command, extra: &[&str]) -> Serve {
        let mut child = cmd
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("LEASEHOLD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = rx.recv_timeout(BOUND).expect("serve prints its address");
        let port = first
            .strip_prefix("serving http://127.0.0.1:")
            .and_then(|r| r.strip_suffix('/'))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not an address line: {first:?}"));
        let token = if extra.contains(&"--allow-force-release") && !extra.contains(&"--token-file")
        {
            let line = rx.recv_timeout(BOUND).expect("serve prints its token");
            Some(
                line.strip_prefix("force-release token: ")
                    .unwrap()
                    .to_owned(),
            )
        } else {
            None
        };
        Serve { child, port, token }
    }

    fn leases(&self) -> Vec<Value> {
        let a = get(self.port, "/api/leases");
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(
            a.headers.contains("content-type: application/json"),
            "{}",
            a.headers
        );
        a.json().as_array().cloned().unwrap()
    }

    /// `POST /api/release` of `key` with `token` (none: no header).
    fn release(&self, key: &str, token: Option<&str>) -> http::Answer {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("Authorization", a));
        }
        let body = serde_json::json!({ "key": key }).to_string();
        request(self.port, "POST", "/api/release", &headers, &body)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it returns `Some`; panics after [`BOUND`].
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {BOUND:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A file store and a SQLite queue in a temp dir.
struct Dirs {
    _dir: tempfile::TempDir,
    store: String,
    queue: String,
}

fn dirs() -> Dirs {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("locks").display());
    let queue = format!("sqlite://{}", dir.path().join("queue.db").display());
    Dirs {
        _dir: dir,
        store,
        queue,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

fn take(rt: &tokio::runtime::Runtime, locks: &Locks, key: &str, ttl: Duration) -> Guard {
    rt.block_on(async { locks.lock(key)?.ttl(ttl).try_acquire().await })
        .unwrap()
        .unwrap_or_else(|| panic!("{key} is free"))
}

/// The row of `key` in `/api/leases`.
fn row<'a>(all: &'a [Value], key: &str) -> Option<&'a Value> {
    all.iter().find(|r| r["key"] == key)
}

/// The JSON, the event stream and force release over one store.
fn leases_json_events_and_release(store: &str, queue: &str) {
    let rt = runtime();
    let locks = rt.block_on(leasehold::connect(store)).unwrap();
    let serve = Serve::start(store, queue, &["--allow-force-release", "--every", "500ms"]);
    let token = serve.token.clone().unwrap();
    assert_eq!(token.len(), 64, "{token}");

    // A lease taken is in /api/leases with its holder and fence.
    let guard = take(&rt, &locks, "app/alpha", Duration::from_secs(3));
    let all = serve.leases();
    let alpha = row(&all, "app/alpha").unwrap_or_else(|| panic!("{all:?}"));
    assert_eq!(alpha["state"], "held");
    assert_eq!(alpha["fence"], guard.fence());
    assert_eq!(alpha["holder"].as_str(), guard.record().holder.as_deref());
    assert!(
        alpha.get("token").is_none(),
        "owner tokens stay private: {alpha}"
    );

    // The event stream tells a lease taken and a lease released.
    let mut events = Events::open(serve.port, "/events");
    events.wait_for("app/alpha is held", BOUND, |s| {
        s.contains(r#"data-key="app/alpha""#)
    });
    let beta = take(&rt, &locks, "app/beta", Duration::from_secs(30));
    let section = events.wait_for("app/beta is held", BOUND, |s| {
        s.contains(r#"data-key="app/beta""#)
    });
    assert!(
        section.contains(&format!(r#"<td class="fence">{}</td>"#, beta.fence())),
        "{section}"
    );
    rt.block_on(beta.release()).unwrap();
    events.wait_for("app/beta is gone", BOUND, |s| {
        !s.contains(r#"data-key="app/beta""#)
    });

    // Force release: refused without the token or with a wrong one, done with the right one,
    // and the holder then loses its lease.
    let a = serve.release("app/alpha", None);
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(
        a.headers.contains("www-authenticate: bearer"),
        "{}",
        a.headers
    );
    let a = serve.release("app/alpha", Some(&format!("{}x", &token[..63])));
    assert_eq!(a.status, 401, "{}", a.body);
    let a = serve.release("", Some(&token));
    assert_eq!(a.status, 400, "{}", a.body);
    let a = request(
        serve.port,
        "POST",
        "/api/release",
        &[("Authorization", &format!("Bearer {token}"))],
        "{not json",
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(guard.is_current());
    let a = serve.release("app/alpha", Some(&token));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["was"]["fence"], guard.fence());
    rt.block_on(async { tokio::time::timeout(BOUND, guard.lost()).await })
        .expect("the holder is told it lost the lease");
    events.wait_for("app/alpha is gone", BOUND, |s| {
        !s.contains(r#"data-key="app/alpha""#)
    });
    eventually("app/alpha not held in /api/leases", || {
        let all = serve.leases();
        row(&all, "app/alpha")
            .is_none_or(|r| r["state"] != "held")
            .then_some(())
    });
}

#[test]
fn file_store_json_events_and_force_release() {
    let d = dirs();
    leases_json_events_and_release(&d.store, &d.queue);
}

#[test]
fn redis_store_json_events_and_force_release() {
    let redis = leasehold_testkit::servers::RedisServer::start();
    let d = dirs();
    leases_json_events_and_release(&redis.url(), &d.queue);
}

#[test]
fn force_release_is_refused_without_the_flag_and_the_page_is_read_only() {
    let d = dirs();
    let rt = runtime();
    let locks = rt.block_on(leasehold::connect(&d.store)).unwrap();
    let serve = Serve::start(&d.store, &d.queue, &[]);
    let guard = take(&rt, &locks, "ro/k", Duration::from_secs(30));
    let a = serve.release("ro/k", Some("anything-at-all-here"));
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("--allow-force-release"), "{}", a.body);
    assert!(guard.is_current());
    let page = get(serve.port, "/");
    assert_eq!(page.status, 200);
    assert!(
        !page.body.contains("button"),
        "no release buttons: {}",
        page.body
    );
    assert!(
        page.headers
            .contains("content-security-policy: default-src 'none'"),
        "{}",
        page.headers
    );
}

#[test]
fn a_page_reached_by_another_name_is_refused() {
    let d = dirs();
    let serve = Serve::start(&d.store, &d.queue, &["--allow-host", "locks.internal"]);
    let by = |host: &str| {
        let h = format!("{host}:{}", serve.port);
        http::request(serve.port, "GET", "/api/leases", &[("Host", &h)], "")
    };
    // A DNS name pointed at this machine by another site (DNS rebinding) reads nothing.
    let a = by("rebind.attacker.example");
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("--allow-host"), "{}", a.body);
    for host in ["127.0.0.1", "localhost", "locks.internal"] {
        assert_eq!(by(host).status, 200, "{host}");
    }
}

#[test]
fn a_token_file_is_the_token() {
    let d = dirs();
    let file = d._dir.path().join("token");
    std::fs::write(&file, "0123456789abcdef-from-a-file\n").unwrap();
    let file = file.display().to_string();
    let serve = Serve::start(
        &d.store,
        &d.queue,
        &["--allow-force-release", "--token-file", &file],
    );
    assert_eq!(
        serve
            .release("k", Some("0123456789abcdef-from-a-file"))
            .status,
        200
    );
    assert_eq!(
        serve
            .release("k", Some("0123456789abcdef-from-a-filf"))
            .status,
        401
    );
}

#[test]
fn hostile_keys_are_text_in_the_page() {
    let d = dirs();
    let rt = runtime();
    let locks = rt.block_on(leasehold::connect(&d.store)).unwrap();
    let hostile = r#"<script>alert("k")</script><img src=x onerror=alert(1)>"#;
    let _guard = take(&rt, &locks, hostile, Duration::from_secs(30));
    let serve = Serve::start(&d.store, &d.queue, &["--allow-force-release"]);
    let page = get(serve.port, "/").body;
    assert!(
        !page.contains("<script>alert") && !page.contains("<img"),
        "{page}"
    );
    assert!(
        page.contains(
            "&lt;script&gt;alert(&quot;k&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
        ),
        "{page}"
    );
    let all = serve.leases();
    assert!(
        row(&all, hostile).is_some(),
        "the JSON has the key as it is: {all:?}"
    );
}

#[test]
fn the_queue_shows_pending_and_running_tasks() {
    use leasehold::queue::{open_queue, NewTask, Priority};
    let d = dirs();
    let rt = runtime();
    let q = rt.block_on(open_queue(&d.queue)).unwrap();
    let serve = Serve::start(&d.store, &d.queue, &[]);
    // A task that runs (sleeps) under its key's lease, and two waiting behind it.
    let sleep = |key: &str, priority| {
        let mut t = NewTask::new(key, r#"{"argv":["sleep","60"]}"#);
        t.priority = priority;
        rt.block_on(q.enqueue(&t)).unwrap()
    };
    let running = sleep("user/alice", Priority::High);
    sleep("user/alice", Priority::Normal);
    sleep("user/alice", Priority::Low);
    let worker = Command::new(BIN)
        .args([
            "--store", &d.store, "queue", "--queue", &d.queue, "work", "--slots", "2",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _worker = Kill(worker);
    let status = eventually("a running task in /api/queue", || {
        let s = get(serve.port, "/api/queue").json();
        (s["running"] == 1 && s["leases"][0]["fence"].is_u64()).then_some(s)
    });
    assert_eq!(status["leases"][0]["task"], running.id);
    assert_eq!(status["leases"][0]["key"], "user/alice");
    assert_eq!(status["pending"]["normal"], 1, "{status}");
    assert_eq!(status["pending"]["low"], 1, "{status}");
    assert_eq!(status["slots"], 2, "{status}");
    let page = get(serve.port, "/").body;
    assert!(page.contains(r#"<dd id="slots">1 of 2</dd>"#), "{page}");
    assert!(
        page.contains(r#"<dd id="pending">high 0, normal 1, low 1</dd>"#),
        "{page}"
    );
    // The worker's key lease is on the page's leases too.
    assert!(page.contains(r#"data-key="user/alice""#), "{page}");
}

/// Without `--queue`, the default queue is shown only once it exists: `serve` does not create
/// it, the page and `/api/queue` say there is none, and a queue made later is picked up.
#[test]
fn the_default_queue_is_shown_once_it_exists_and_never_created() {
    use leasehold::queue::{open_queue, NewTask};
    let d = dirs();
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("leasehold").join("queue.db");
    let serve = Serve::start_with_default_queue(&d.store, state.path(), &["--every", "200ms"]);
    let a = get(serve.port, "/api/queue");
    assert_eq!(a.status, 404, "{}", a.body);
    let v = a.json();
    assert_eq!(v["error"], "no queue", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains(&file.display().to_string()) && message.contains("does not exist"),
        "{message}"
    );
    let page = get(serve.port, "/").body;
    assert!(
        page.contains(r#"<p class="empty" id="no-queue">No queue: the default queue"#),
        "{page}"
    );
    assert!(!file.exists(), "serve created the default queue");
    assert!(
        !file.parent().unwrap().exists(),
        "serve created the queue's directory"
    );

    // `queue add` (here the library) creates it; serve shows it from then on.
    let rt = runtime();
    let q = rt
        .block_on(open_queue(&format!("sqlite://{}", file.display())))
        .unwrap();
    rt.block_on(q.enqueue(&NewTask::new("user/bob", r#"{"argv":["true"]}"#)))
        .unwrap();
    let status = eventually("the queue in /api/queue", || {
        let a = get(serve.port, "/api/queue");
        (a.status == 200).then(|| a.json())
    });
    assert_eq!(status["pending"]["normal"], 1, "{status}");
    let page = get(serve.port, "/").body;
    assert!(
        page.contains(r#"<dd id="pending">high 0, normal 1, low 0</dd>"#)
            && !page.contains("no-queue"),
        "{page}"
    );
}

/// Free records are not rows of the page, which says how many it hides; `/api/leases` lists
/// them.
#[test]
fn the_page_counts_the_free_records_it_hides() {
    let d = dirs();
    let rt = runtime();
    let locks = rt.block_on(leasehold::connect(&d.store)).unwrap();
    for key in ["done/1", "done/2"] {
        rt.block_on(take(&rt, &locks, key, Duration::from_secs(30)).release())
            .unwrap();
    }
    let serve = Serve::start(&d.store, &d.queue, &[]);
    let page = get(serve.port, "/").body;
    assert!(page.contains("No lease held."), "{page}");
    assert!(
        page.contains(r#"<p class="note" id="free">2 free records not shown"#),
        "{page}"
    );
    let held = take(&rt, &locks, "busy", Duration::from_secs(30));
    let page = get(serve.port, "/").body;
    assert!(page.contains(r#"data-key="busy""#), "{page}");
    assert!(!page.contains(r#"data-key="done/1""#), "{page}");
    assert!(page.contains("2 free records not shown"), "{page}");
    rt.block_on(held.release()).unwrap();
    let page = get(serve.port, "/").body;
    assert!(page.contains("3 free records not shown"), "{page}");
    let all = serve.leases();
    assert_eq!(all.len(), 3, "the JSON lists them: {all:?}");
    assert!(all.iter().all(|r| r["state"] == "free"), "{all:?}");
}

#[test]
fn a_bad_listen_address_is_a_usage_error() {
    for bad in ["nonsense", "127.0.0.1", "300.0.0.1:80", "127.0.0.1:99999"] {
        let out = Command::new(BIN)
            .args(["--store", "memory://", "serve", "--listen", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--listen"), "{bad}: {err}");
    }
}

/// The page in a real browser: a held key's row with its holder and fence, rows appearing and
/// going live as leases are taken and released, the countdown running, hostile keys as text,
/// and a screenshot.
#[test]
fn a_browser_sees_the_leases_live() {
    let d = dirs();
    let rt = runtime();
    let locks = rt.block_on(leasehold::connect(&d.store)).unwrap();
    let alpha = take(&rt, &locks, "billing/invoice-run", Duration::from_secs(30));
    let hostile = r#"<img src=x onerror="window.pwned=1">"#;
    let _hostile = take(&rt, &locks, hostile, Duration::from_secs(30));
    let sem = rt
        .block_on(
            locks
                .semaphore("exports", 3)
                .unwrap()
                .ttl(Duration::from_secs(30))
                .try_acquire(),
        )
        .unwrap()
        .unwrap();
    let serve = Serve::start(
        &d.store,
        &d.queue,
        &["--allow-force-release", "--every", "500ms"],
    );
    let browser = webdriver::Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/", serve.port));

    const ROWS: &str = "return [...document.querySelectorAll('#leases tbody tr')].map(tr => ({
        key: tr.dataset.key,
        holder: tr.querySelector('.holder').textContent,
        fence: tr.querySelector('.fence').textContent,
        expires: tr.querySelector('.expires').textContent,
    }));";
    let find = |rows: &Value, key: &str| -> Option<Value> {
        rows.as_array()?.iter().find(|r| r["key"] == key).cloned()
    };
    let rows = browser.wait_for("the held key's row", BOUND, ROWS, |v| {
        find(v, "billing/invoice-run").is_some()
    });
    let row = find(&rows, "billing/invoice-run").unwrap();
    assert_eq!(
        row["holder"].as_str(),
        alpha.record().holder.as_deref(),
        "{row}"
    );
    assert_eq!(row["fence"], alpha.fence().to_string(), "{row}");
    let _ = sem;
    browser.wait_for(
        "the page is live",
        BOUND,
        "return document.getElementById('live').textContent",
        |v| v == "live",
    );

    // The hostile key is a row whose text is the key; nothing it says ran.
    let row = find(&rows, hostile).unwrap_or_else(|| panic!("{rows}"));
    assert_eq!(row["key"], hostile);
    assert_eq!(
        browser.eval(
            "return window.pwned === undefined && document.querySelectorAll('#leases img').length"
        ),
        0
    );

    // A lease taken appears, released goes, without a reload.
    browser.eval("window.notReloaded = true; return null");
    let beta = take(&rt, &locks, "reports/nightly", Duration::from_secs(20));
    let rows = browser.wait_for("reports/nightly appears", BOUND, ROWS, |v| {
        find(v, "reports/nightly").is_some()
    });
    assert_eq!(
        find(&rows, "reports/nightly").unwrap()["fence"],
        beta.fence().to_string()
    );
    // The countdown runs.
    let first = find(&rows, "reports/nightly").unwrap()["expires"].clone();
    browser.wait_for("the countdown moves", BOUND, ROWS, |v| {
        find(v, "reports/nightly").is_some_and(|r| r["expires"] != first)
    });
    // The screenshot for the book, with the queue's section too.
    screenshot(&browser, "serve.png");

    rt.block_on(beta.release()).unwrap();
    browser.wait_for("reports/nightly goes", BOUND, ROWS, |v| {
        find(v, "reports/nightly").is_none()
    });
    assert_eq!(
        browser.eval("return window.notReloaded === true"),
        true,
        "live, not reloaded"
    );
}

/// A screenshot of the browser's window, checked to be a PNG of the window's size, saved as
/// `name` in the tests' temporary directory.
fn screenshot(browser: &webdriver::Browser, name: &str) {
    let png = browser.screenshot();
    assert!(png.len() > 2_000, "a PNG of {} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(width >= 800 && height >= 500, "{width}x{height}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, &png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

/// Force release from the page in a real browser: the release button asks for confirmation;
/// without the token, or with a wrong one, the click fails with the server's 401 shown on the
/// page and the key stays held; with the token typed into the page's field the key is freed in
/// the store, its row goes, and its holder loses the lease.
#[test]
fn a_browser_force_releases_with_the_token_only() {
    let d = dirs();
    let token = "page-token-0123456789abcdef";
    let token_file = d._dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let rt = runtime();
    let locks = rt.block_on(leasehold::connect(&d.store)).unwrap();
    let stuck = take(&rt, &locks, "ops/stuck", Duration::from_secs(30));
    let other = take(&rt, &locks, "ops/other", Duration::from_secs(30));
    let serve = Serve::start(
        &d.store,
        &d.queue,
        &[
            "--allow-force-release",
            "--token-file",
            &token_file.display().to_string(),
            "--every",
            "500ms",
        ],
    );
    let browser = webdriver::Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/", serve.port));
    browser.wait_for(
        "the page is live",
        BOUND,
        "return document.getElementById('live').textContent",
        |v| v == "live",
    );
    const BUTTON: &str = r#"button.release[data-key="ops/stuck"]"#;
    const MESSAGE: &str = "return document.getElementById('message').textContent";
    const KEYS: &str =
        "return [...document.querySelectorAll('#leases tbody tr')].map(tr => tr.dataset.key)";
    let has = |v: &Value, key: &str| v.as_array().is_some_and(|a| a.iter().any(|k| k == key));
    browser.wait_for(
        "the release button is enabled",
        BOUND,
        &format!("const b = document.querySelector('{BUTTON}'); return b !== null && !b.disabled"),
        |v| v == true,
    );

    // No token, then a wrong one: the click asks, is refused (401, said on the page), and the
    // key stays held.
    for (typed, attempt) in [
        ("", "no token"),
        ("page-token-0123456789abcdeX", "a wrong token"),
    ] {
        browser.type_into("#token", typed, BOUND);
        browser.eval("document.getElementById('message').textContent = ''; return null");
        browser.click(BUTTON, BOUND);
        let asked = browser.accept_dialog(BOUND);
        assert!(asked.contains("ops/stuck"), "{attempt}: {asked}");
        let said = browser.wait_for(&format!("{attempt}: the refusal"), BOUND, MESSAGE, |v| {
            v.as_str().is_some_and(|s| !s.is_empty())
        });
        assert!(
            said.as_str()
                .unwrap()
                .starts_with("401: a force release needs"),
            "{attempt}: {said}"
        );
        assert!(stuck.is_current(), "{attempt}");
        let all = serve.leases();
        assert_eq!(
            row(&all, "ops/stuck").unwrap()["state"],
            "held",
            "{attempt}"
        );
        assert!(has(&browser.eval(KEYS), "ops/stuck"), "{attempt}");
    }
    screenshot(&browser, "serve-release-refused.png");

    // The right token, typed into the page's field: released.
    browser.type_into("#token", token, BOUND);
    browser.click(BUTTON, BOUND);
    browser.accept_dialog(BOUND);
    let said = browser.wait_for("the release", BOUND, MESSAGE, |v| {
        v.as_str().is_some_and(|s| s.starts_with("released"))
    });
    assert_eq!(said, r#"released "ops/stuck""#);
    browser.wait_for("the row goes", BOUND, KEYS, |v| {
        !has(v, "ops/stuck") && has(v, "ops/other")
    });
    let key = leasehold::Key::new("ops/stuck").unwrap();
    match rt.block_on(locks.store().inspect(&key)).unwrap() {
        None => {}
        Some(leasehold::Inspection::Record(r)) => {
            assert!(r.token.is_none() && r.holder.is_none(), "still held: {r:?}")
        }
        Some(other) => panic!("{other:?}"),
    }
    rt.block_on(async { tokio::time::timeout(BOUND, stuck.lost()).await })
        .expect("the holder is told it lost the lease");
    assert!(other.is_current(), "only the key clicked is released");
    screenshot(&browser, "serve-release.png");
}
