"""Starts what the tests talk to, for the whole session: configd serve
with its embedded etcd, a provider "llm" set through configd, and a real
sluice-agent joined to it that also enforces a local provider "fixed"
(3 requests and 1,000 tokens per hour: no window boundary comes within
the tests, so every refusal there is decided by the counts alone).

The binaries come from $SLUICE_BIN_DIR (make python-test builds them into
bin/), or are built here with go."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

from sluice_agent import Limiter  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process whose stderr lines are kept and watched."""

    def __init__(self, name: str, args: List[str], log: str) -> None:
        self.name = name
        self.lines: List[str] = []
        self._cond = threading.Condition()
        self._log = open(log, "w")
        self.p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self._log.write(line)
            self._log.flush()
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append("")  # EOF
            self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60.0) -> "re.Match[str]":
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if line == "":
                        raise RuntimeError(f"{self.name} exited: {''.join(self.lines[-20:])}")
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.name}: no line matching {pattern!r}")
                self._cond.wait(left)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._reader.join(timeout=5)
        self._log.close()


def binaries(tmp: str) -> Dict[str, str]:
    d = os.environ.get("SLUICE_BIN_DIR")
    if not d:
        d = os.path.join(tmp, "bin")
        subprocess.run(["go", "build", "-o", d + "/", "./configd", "./agent/sluice-agent"], cwd=ROOT, check=True)
    return {"configd": os.path.join(d, "configd"), "agent": os.path.join(d, "sluice-agent")}


class Cluster:
    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.bins = binaries(tmp)
        self.procs: List[Proc] = []
        self.urls: Dict[str, str] = {}
        self.token = "py-test-token-0123456789"
        self.token_file = os.path.join(tmp, "agent.token")
        with open(self.token_file, "w") as f:
            f.write(self.token + "\n")
        self.etcd = f"http://127.0.0.1:{free_port()}"
        data = os.path.join(tmp, "configd.etcd")
        cd = self.start("configd", [self.bins["configd"], "serve", "--data-dir", data, "--listen", "127.0.0.1:0",
                                    "--embedded-client-url", self.etcd,
                                    "--embedded-peer-url", f"http://127.0.0.1:{free_port()}"])
        self.admin = "http://" + cd.wait_line(r'msg="configd serving".* listen=(\S+)').group(1)
        self.password_file = os.path.join(data, "credentials", "instance")

    def start(self, name: str, args: List[str]) -> Proc:
        p = Proc(name, args, os.path.join(self.tmp, name + ".log"))
        self.procs.append(p)
        return p

    def configd(self, *args: str) -> str:
        out = subprocess.run([self.bins["configd"], *args, "--server", self.admin], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"configd {args}: {out.stderr}")
        return out.stdout

    def instances(self, provider: str) -> Dict[str, Any]:
        """configd's view of provider's instances: each one's record as it
        last wrote it (GET /v1/providers/NAME/instances)."""
        with urllib.request.urlopen(f"{self.admin}/v1/providers/{provider}/instances", timeout=10) as r:
            return json.load(r)  # type: ignore[no-any-return]

    def agent(self, name: str, *extra: str) -> str:
        """Starts an agent; returns its HTTP socket. With --listen, its
        TCP address is in self.urls[name]."""
        sock = os.path.join(self.tmp, name + ".sock")
        p = self.start(name, [self.bins["agent"], "--socket", sock, "--grpc-socket", os.path.join(self.tmp, name + "-grpc.sock"),
                              "--etcd-endpoints", self.etcd, "--etcd-username", "instance",
                              "--etcd-password-file", self.password_file, "--id", name, "--lease-ttl", "2s", *extra])
        m = p.wait_line(r'msg="agent serving" http="?\[([^\]]*)\]')
        tcp = [a for a in m.group(1).split() if not a.startswith("/")]
        if tcp:
            self.urls[name] = "http://" + tcp[0]
        return sock

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def wait_share(sock: str, provider: str, timeout: float = 60.0) -> None:
    """Until the agent enforces a share of every limit of provider."""
    lim = Limiter(provider, socket=sock)
    deadline = time.monotonic() + timeout
    while True:
        for p in lim.status()["providers"]:
            if p["name"] == provider and p["ready"] and all(l["quota"] > 0 for l in p["limits"]):
                lim.close()
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{provider}: no share within {timeout} s: {lim.status()}")
        time.sleep(0.02)  # polling the agent's progress


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    tmp = tempfile.mkdtemp(prefix="sluice-py-")
    c = Cluster(tmp)
    try:
        c.configd("set", "llm", "--limit", "50/1s", "--limit", "tokens=5000/1s")
        c.sock = c.agent("agent-a", "--provider", "llm", "--allow", "llm*", "--local", "fixed=3/1h,tokens=1000/1h",
                         "--listen", "127.0.0.1:0", "--token-file", c.token_file)
        wait_share(c.sock, "llm")
        yield c
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def sock(cluster: Cluster) -> str:
    return cluster.sock  # type: ignore[attr-defined]


def until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Polls the agent's state until cond holds: the agent has no event to
    await for it. The deadline only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(0.002)


def fixed_remaining(sock: str) -> Dict[str, int]:
    for p in Limiter("fixed", socket=sock).status()["providers"]:
        if p["name"] == "fixed":
            return {l["dimension"]: l["remaining"] for l in p["limits"]}
    raise KeyError("fixed")


def fixed_waiting(sock: str) -> int:
    for p in Limiter("fixed", socket=sock).status()["providers"]:
        if p["name"] == "fixed":
            return p["limits"][0]["waiting"]
    raise KeyError("fixed")
