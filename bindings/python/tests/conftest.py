"""Fixtures of the package's tests: the real servers the harness started.

The harness (``cargo test -p leasehold-cli --test python``, run by the test command) starts
Redis, a proxy in front of it, the Kubernetes Lease API server, the Cloud Storage emulator and
PostgreSQL, and names them in ``LEASEHOLD_TEST_*`` variables. A test whose server is not named
fails: none is ever skipped for lack of a server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

HERE = Path(__file__).parent


def need(name: str) -> str:
    """The variable ``name`` the harness sets, or a failure saying how to run the tests."""
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: run these tests through the harness "
            "(cargo test -p leasehold-cli --test python), which starts the servers"
        )
    return value


def unique(stem: str) -> str:
    """A key no other test uses."""
    return f"{stem}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["file", "redis", "k8s", "gcs"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL of each kind the package's lock tests run on."""
    kind = request.param
    if kind == "file":
        return f"file://{tmp_path / 'locks'}"
    return need({"redis": "LEASEHOLD_TEST_REDIS", "k8s": "LEASEHOLD_TEST_K8S", "gcs": "LEASEHOLD_TEST_GCS"}[kind])


class Proxy:
    """The harness's proxy in front of Redis: ``pause()`` cuts the store off, ``resume()``
    restores it (nothing sent meanwhile is lost)."""

    def __init__(self, control: str) -> None:
        host, port = control.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=10)
        self._file = self._sock.makefile("rw")
        self.url = need("LEASEHOLD_TEST_REDIS_PROXIED")

    def _say(self, what: str) -> None:
        self._file.write(what + "\n")
        self._file.flush()
        answer = self._file.readline().strip()
        assert answer == "ok", answer

    def pause(self) -> None:
        self._say("pause")

    def resume(self) -> None:
        self._say("resume")

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    p = Proxy(need("LEASEHOLD_TEST_PROXY"))
    try:
        yield p
    finally:
        p.resume()
        p.close()


class Children:
    """Python processes running ``tests/child.py``, killed at the test's end."""

    def __init__(self) -> None:
        self.procs: List[subprocess.Popen[str]] = []

    def start(self, *args: str) -> "subprocess.Popen[str]":
        p = subprocess.Popen(
            [sys.executable, str(HERE / "child.py"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    @staticmethod
    def line(p: "subprocess.Popen[str]") -> str:
        """The child's next line of output (it fails the test when the child ended instead)."""
        assert p.stdout is not None
        text = p.stdout.readline()
        if not text:
            err = p.stderr.read() if p.stderr else ""
            raise AssertionError(f"child ended (status {p.wait()}): {err}")
        return text.strip()

    def finish(self, p: "subprocess.Popen[str]", timeout: float = 60) -> str:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"child failed ({p.returncode}): {err}"
        return out

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def children() -> Iterator[Children]:
    c = Children()
    try:
        yield c
    finally:
        c.kill_all()


# ---- queue ----


def cli() -> str:
    """The ``leasehold`` command the harness names (``LEASEHOLD_CLI``), else the workspace's debug
    build; a failure saying how to get one when there is none."""
    given = os.environ.get("LEASEHOLD_CLI")
    path = Path(given) if given else HERE.parent.parent.parent / "target" / "debug" / "leasehold"
    if not path.is_file():
        pytest.fail(
            f"no leasehold command at {path}: set LEASEHOLD_CLI, or build it "
            "(cargo build -p leasehold-cli)"
        )
    return str(path)


def reset_queue(url: str) -> None:
    """Empties the shared PostgreSQL queue between tests: pending tasks cancelled, ended ones
    deleted (with the bookkeeping of their keys)."""
    from leasehold import queue

    q = queue.connect(url)
    for t in q.tasks_sync(limit=100_000):
        q.cancel_sync(t["id"])
    q.cleanup_sync(0)
    left = q.tasks_sync()
    assert not left, f"tasks still running in the shared queue: {left}"


@pytest.fixture(params=["sqlite", "postgres"])
def queue_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A queue of each backend, empty: a new SQLite file, or the harness's PostgreSQL database
    (``LEASEHOLD_TEST_POSTGRES``) emptied. ``LEASEHOLD_STORE`` is unset, so a worker takes its
    leases where ``leasehold queue work`` would."""
    monkeypatch.delenv("LEASEHOLD_STORE", raising=False)
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'queue.db'}"
    url = need("LEASEHOLD_TEST_POSTGRES")
    reset_queue(url)
    return url
