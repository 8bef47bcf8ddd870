#!/usr/bin/env python3
"""A pool of Python worker processes calling a stub LLM-style API with
requests- and tokens-per-window limits, through sluice's local agent.

Each worker asks the agent for 1 request and an estimate of the tokens
(max_tokens), calls the stub, and settles the tokens the stub says the
call used (50-100% of the estimate). The stub -- in this process --
counts what arrives in each aligned window, refuses with 429 what is over
its limits, and at the end the program prints, for each whole window of
the run, what was admitted against each limit. Offered load is well
above the limits, so the limits bind.

    python3 examples/python/llm_workers.py --socket /tmp/sluice-agent.sock --provider llm

--socket may name several agents (comma-separated; each a member of the
same provider): the workers are spread over them. The provider's limits
are read from the agent (its shared total, or a local provider's quota).
Standard library and sluice_agent only (found in clients/python when not
installed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

from sluice_agent import Closed, Limiter, SluiceError, Timeout  # noqa: E402


class Stub:
    """A model API's limits: requests and tokens per aligned window,
    counted on arrival, as the real provider counts them."""

    def __init__(self, requests: int, tokens: int, window: float) -> None:
        self.limits = {"requests": requests, "tokens": tokens}
        self.window = window
        self.mu = threading.Lock()
        self.wins: Dict[int, Dict[str, int]] = {}

    def call(self, max_tokens: int) -> Tuple[int, int]:
        k = int(time.time() // self.window)
        used = random.randint(max_tokens // 2, max_tokens)
        with self.mu:
            w = self.wins.setdefault(k, {"requests": 0, "tokens": 0, "refused": 0})
            w["requests"] += 1
            # A model API counts the tokens of every call that arrives.
            w["tokens"] += used
            if w["requests"] > self.limits["requests"] or w["tokens"] > self.limits["tokens"]:
                w["refused"] += 1
                return 429, 0
        return 200, used


def serve_stub(stub: Stub) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, used = stub.call(int(body["max_tokens"]))
            out = json.dumps({"usage": {"total_tokens": used}}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def worker(i: int, sock: str, provider: str, stub_port: int, until: float, max_wait: float, q: "multiprocessing.Queue[Dict[str, int]]") -> None:
    import http.client
    lim = Limiter(provider, caller=f"worker-{i}", socket=sock)
    conn = http.client.HTTPConnection("127.0.0.1", stub_port)
    n = {"calls": 0, "timeouts": 0, "refused": 0}
    while time.time() < until:
        est = random.randint(200, 1000)
        try:
            with lim.acquire(tokens=est, max_wait=max_wait) as g:
                conn.request("POST", "/v1/complete", json.dumps({"max_tokens": est}))
                resp = conn.getresponse()
                usage = json.loads(resp.read())["usage"]["total_tokens"]
                n["calls"] += 1
                if resp.status == 429:
                    n["refused"] += 1
                g.settle(tokens=usage)
        except Timeout:
            n["timeouts"] += 1
        except SluiceError as e:
            print(f"worker-{i}: {e}", file=sys.stderr)
            time.sleep(0.1)
    q.put(n)


def limits(sock: str, provider: str, patience: float = 180.0) -> Tuple[Dict[str, int], float]:
    """The provider's limits per dimension (the fleet's total) and window,
    once this agent's share is in force. An agent that has just joined
    enforces a share of 0 until the next window boundary of the provider
    (so that it never adds to what the others admit in the current one),
    and until then its status names no window yet: wait for it."""
    deadline, said = time.monotonic() + patience, False
    while True:
        try:
            st = Limiter(provider, socket=sock).status()
        except Closed:
            st = None  # the agent started with & is not listening yet
        held = [p for p in st["providers"] if p["name"] == provider] if st else [{"ready": False, "limits": []}]
        if not held:
            raise SystemExit(f"the agent at {sock} does not hold {provider}: {st['providers']}")
        p = held[0]
        if p["ready"] and p["limits"] and all(lm["quota"] > 0 for lm in p["limits"]):
            out, window = {}, 0.0
            for lm in p["limits"]:
                out[lm["dimension"]] = lm.get("total") or lm["quota"]
                window = parse_window(lm["window"])
            return out, window
        if time.monotonic() > deadline and st is None:
            raise SystemExit(f"the agent at {sock} did not answer in {patience:.0f} s: is sluice-agent running?")
        if time.monotonic() > deadline:
            raise SystemExit(f"the agent at {sock} has no share of {provider} in force after {patience:.0f} s: "
                             f"is configd serving, and `configd set {provider} ...` done? {p}")
        if not said:
            print(f"waiting for the agent's share of {provider} to come in force (at the next window boundary)",
                  flush=True)
            said = True
        time.sleep(0.5)


def parse_window(s: str) -> float:
    """Seconds in a Go duration as the agent prints it: "1s", "1m0s", "500ms"."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(h|ms|m|us|\u00b5s|ns|s)", s)
    if not parts or "".join(n + u for n, u in parts) != s:
        raise ValueError(f"window {s!r}")
    return sum(float(n) * units[u] for n, u in parts)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("SLUICE_AGENT_SOCKET", "/run/sluice/agent.sock"),
                    help="the agents' HTTP sockets, comma-separated")
    ap.add_argument("--provider", default="llm")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--windows", type=int, default=2, help="whole windows to run for")
    args = ap.parse_args(argv)
    socks = [s for s in args.socket.split(",") if s]
    lims, window = limits(socks[0], args.provider)
    stub = Stub(lims.get("requests", 1 << 62), lims.get("tokens", 1 << 62), window)
    srv = serve_stub(stub)
    now = time.time()
    first = (int(now // window) + 1) * window  # the first whole window
    until = first + args.windows * window
    print(f"{args.workers} workers, {len(socks)} agent(s), provider {args.provider}: "
          + ", ".join(f"{v} {k}" for k, v in lims.items()) + f" per {window:g} s window; "
          f"running {until - now:.0f} s", flush=True)
    ctx = multiprocessing.get_context("fork")
    q: "multiprocessing.Queue[Dict[str, int]]" = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(i, socks[i % len(socks)], args.provider, srv.server_address[1], until,
                                             window, q)) for i in range(args.workers)]
    for p in ps:
        p.start()
    totals = {"calls": 0, "timeouts": 0, "refused": 0}
    for _ in ps:
        for k, v in q.get().items():
            totals[k] += v
    for p in ps:
        p.join()
    srv.shutdown()
    print(f"{'window':<10} {'requests':>9} {'limit':>7} {'tokens':>9} {'limit':>9} {'429s':>5}")
    over = 0
    whole = [k for k in sorted(stub.wins) if first <= k * window and (k + 1) * window <= until]
    for k in whole:
        w = stub.wins[k]
        bad = w["requests"] > stub.limits["requests"] or w["tokens"] > stub.limits["tokens"]
        over += bad
        start = time.strftime("%H:%M:%S", time.localtime(k * window))
        print(f"{start:<10} {w['requests']:>9} {lims.get('requests', 0):>7} {w['tokens']:>9} {lims.get('tokens', 0):>9} "
              f"{w['refused']:>5}{'  OVER' if bad else ''}")
    print(f"windows over a limit: {over} of {len(whole)}; calls {totals['calls']}, refused by the stub "
          f"{totals['refused']}, timeouts at the agent {totals['timeouts']}")
    if not whole:
        print("no whole window was measured", file=sys.stderr)
        return 1
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
