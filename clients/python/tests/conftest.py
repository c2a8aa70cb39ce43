"""Fixtures: a real ``mqd`` for the tests.

Nothing is built here: the broker is the binary at ``$MQ_TEST_MQD`` (default
``target/debug/mqd`` of this repository, which ``cargo test --workspace`` or ``cargo build``
makes). It listens on ``127.0.0.1:0`` (its first stdout line names the port) with a temporary
data directory, and is stopped by its PID in teardown (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from mq_client import Client

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT = float(os.environ.get("MQ_TEST_START_TIMEOUT", "30"))
# Large enough for the large-message tests (the default body limit is 4 MiB).
MAX_BODY = 16 * 1024 * 1024


def mqd_path() -> Path:
    p = Path(os.environ.get("MQ_TEST_MQD") or REPO / "target" / "debug" / "mqd")
    if not p.exists():
        pytest.exit(
            f"no mqd at {p}: build it (cargo build -p mq-broker) or set MQ_TEST_MQD", returncode=2
        )
    return p


class Mqd:
    """A running mqd process."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="mq-py-test-"))
        self.log_path = self.data_dir.parent / (self.data_dir.name + ".log")
        self._log = open(self.log_path, "wb")
        cmd = [
            str(mqd_path()),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(self.data_dir / "data"),
            "--max-body-bytes",
            str(MAX_BODY),
            "--journal-segment-bytes",
            str(32 * 1024 * 1024),
            *(extra or []),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQD_")}
        env.setdefault("RUST_LOG", "warn")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log, env=env
        )
        self.pid = self.proc.pid
        line = self._first_line()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"mqd's first line is {line!r}; its log: {self.log()}")
        self.addr = line[len("listening on ") :].strip()
        self.url = f"http://{self.addr}"
        # Keep draining stdout so mqd never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _first_line(self) -> str:
        got: List[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            got.append(self.proc.stdout.readline().decode(errors="replace"))

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(START_TIMEOUT)
        if not got:
            self.stop()
            raise RuntimeError(f"mqd did not start within {START_TIMEOUT} s; log: {self.log()}")
        return got[0]

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        try:
            self.log_path.unlink()
        except OSError:
            pass


@pytest.fixture(scope="session")
def mqd() -> Iterator[Mqd]:
    broker = Mqd()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def client(mqd: Mqd) -> Iterator[Client]:
    with Client(mqd.url, call_timeout=30) as c:
        yield c


@pytest.fixture
def qname(client: Client) -> Iterator[str]:
    """A fresh queue's name (created, deleted after the test)."""
    name = ".\\private$\\py-" + uuid.uuid4().hex[:12]
    client.create_queue(name)
    yield name
    try:
        client.delete_queue(name)
    except Exception:  # noqa: BLE001 - the test may have deleted it
        pass


@pytest.fixture
def txqname(client: Client) -> Iterator[str]:
    """A fresh transactional queue's name."""
    name = ".\\private$\\pytx-" + uuid.uuid4().hex[:12]
    client.create_queue(name, transactional=True)
    yield name
    try:
        client.delete_queue(name)
    except Exception:  # noqa: BLE001
        pass


def wait_until(cond, timeout: float = 30.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Polls ``cond`` (bounded; never a fixed sleep for correctness)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)
