// leasehold serve: live updates over server-sent events, the countdowns, force release.
// The sections arrive as HTML the server rendered (and escaped); nothing here builds HTML from
// store data.
"use strict";

(function () {
  const live = document.getElementById("live");
  const message = document.getElementById("message");
  const token = document.getElementById("token");
  // When the countdowns' figures were received (this page's monotonic clock).
  let received = performance.now();

  function format(ms) {
    if (ms < 1000) return Math.floor(ms) + "ms";
    if (ms < 60000) return (Math.floor(ms / 100) / 10).toFixed(1) + "s";
    let s = Math.floor(ms / 1000);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    s = s % 60;
    return (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
  }

  function tick() {
    const elapsed = performance.now() - received;
    for (const el of document.querySelectorAll(".countdown")) {
      const left = Number(el.dataset.ms) - elapsed;
      el.textContent = left > 0 ? format(left) : "expiring";
    }
  }

  function enableButtons() {
    for (const b of document.querySelectorAll("button.release")) {
      b.disabled = false;
    }
  }

  async function release(button) {
    const body = { key: button.dataset.key };
    if (button.dataset.holder !== undefined) body.holder = button.dataset.holder;
    const what = body.holder === undefined ? body.key : body.holder + " on " + body.key;
    if (!window.confirm("Free " + what + " whoever holds it?")) return;
    let answer;
    try {
      answer = await fetch("/api/release", {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          "Authorization": "Bearer " + (token ? token.value : ""),
        },
        body: JSON.stringify(body),
      });
    } catch (e) {
      message.textContent = "release failed: " + e;
      return;
    }
    const text = await answer.text();
    let said = text;
    try { said = JSON.parse(text).message || text; } catch (e) { /* not JSON */ }
    message.textContent = (answer.ok ? "" : answer.status + ": ") + said;
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button.release");
    if (button) release(button);
  });

  enableButtons();
  setInterval(tick, 200);

  if (!window.EventSource) return;
  const events = new EventSource("/events");
  events.addEventListener("open", function () {
    live.textContent = "live";
    live.className = "on";
  });
  events.addEventListener("error", function () {
    live.textContent = "reconnecting…";
    live.className = "off";
  });
  events.addEventListener("update", function (event) {
    const update = JSON.parse(event.data);
    document.getElementById("leases-section").innerHTML = update.leases;
    document.getElementById("queue-section").innerHTML = update.queue;
    received = performance.now();
    enableButtons();
    tick();
  });
})();
