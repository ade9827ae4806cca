//! Debian's chromium, headless, driven through chromedriver's W3C WebDriver HTTP API.

use super::http::{self, request};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to install when chromium or chromedriver is missing.
const INSTALL: &str = "install Debian's chromium and its driver: `apt-get install -y chromium \
                       chromium-driver` (scripts/test does)";

/// A chromedriver process and one browser session.
pub(crate) struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl Browser {
    /// Starts chromedriver and a headless chromium with a fresh profile and nothing that
    /// reaches out to the network. Panics, saying what to install, when either is missing.
    pub(crate) fn start() -> Browser {
        let driver_bin = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| panic!("chromedriver is not installed: {INSTALL}"));
        let chromium = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| panic!("chromium is not installed: {INSTALL}"));
        let port = free_port();
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver_bin}: {e}; {INSTALL}"));
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && request(port, "GET", "/status", &[], "").json()["value"]["ready"] == true;
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not get ready on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1100,720",
            &format!("--user-data-dir={}", browser._profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let answer = request(
            port,
            "POST",
            "/session",
            &[("Content-Type", "application/json")],
            &caps.to_string(),
        );
        assert_eq!(answer.status, 200, "no browser session: {}", answer.body);
        browser.session = answer.json()["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id: {}", answer.body))
            .to_owned();
        browser
    }

    /// A command of the session; the answer whatever its status.
    fn send(&self, method: &str, path: &str, body: &Value) -> http::Answer {
        let path = format!("/session/{}{path}", self.session);
        let body = if method == "GET" {
            String::new()
        } else {
            body.to_string()
        };
        request(
            self.port,
            method,
            &path,
            &[("Content-Type", "application/json")],
            &body,
        )
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let a = self.send(method, path, body);
        assert_eq!(a.status, 200, "{method} {path}: {}", a.body);
        a.json()["value"].take()
    }

    /// Finds the element `css` selects and runs `then` on its WebDriver id; finds it again when
    /// the page swapped it out meanwhile (a live update); panics when there is none after `bound`.
    fn with_element(&self, css: &str, bound: Duration, then: impl Fn(&str) -> http::Answer) {
        const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
        let deadline = Instant::now() + bound;
        loop {
            let found = self.send(
                "POST",
                "/element",
                &json!({ "using": "css selector", "value": css }),
            );
            let last = match found.json()["value"][ELEMENT].as_str() {
                Some(id) if found.status == 200 => {
                    let a = then(id);
                    if a.status == 200 {
                        return;
                    }
                    a.body
                }
                _ => found.body,
            };
            assert!(
                Instant::now() < deadline,
                "not within {bound:?}: {css}: {last}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the element `css` selects (found again if a live update replaced it).
    pub(crate) fn click(&self, css: &str, bound: Duration) {
        self.with_element(css, bound, |id| {
            self.send("POST", &format!("/element/{id}/click"), &json!({}))
        });
    }

    /// Empties the input `css` selects and types `text` into it.
    pub(crate) fn type_into(&self, css: &str, text: &str, bound: Duration) {
        self.with_element(css, bound, |id| {
            let cleared = self.send("POST", &format!("/element/{id}/clear"), &json!({}));
            if cleared.status != 200 {
                return cleared;
            }
            self.send(
                "POST",
                &format!("/element/{id}/value"),
                &json!({ "text": text }),
            )
        });
    }

    /// Accepts the dialog the page opened (`window.confirm`) once it is open, and returns its
    /// text; panics when none opens within `bound`.
    pub(crate) fn accept_dialog(&self, bound: Duration) -> String {
        let deadline = Instant::now() + bound;
        loop {
            let a = self.send("GET", "/alert/text", &json!({}));
            if a.status == 200 {
                let text = a.json()["value"].as_str().unwrap_or_default().to_owned();
                self.call("POST", "/alert/accept", &json!({}));
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no dialog within {bound:?}: {}",
                a.body
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Loads `url`.
    pub(crate) fn goto(&self, url: &str) {
        self.call("POST", "/url", &json!({ "url": url }));
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub(crate) fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            &json!({ "script": script, "args": [] }),
        )
    }

    /// Polls `script` until `pred` holds for its value; panics after `bound`.
    pub(crate) fn wait_for(
        &self,
        what: &str,
        bound: Duration,
        script: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + bound;
        loop {
            let v = self.eval(script);
            if pred(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "not within {bound:?}: {what}; last: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the window.
    pub(crate) fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let v = self.call("GET", "/screenshot", &json!({}));
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let port = self.port;
            let _ = std::panic::catch_unwind(move || request(port, "DELETE", &path, &[], ""));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
