"""The Python client against a real agent, configd and etcd (conftest)."""

from __future__ import annotations

import collections
import math
import multiprocessing
import threading
import time
from typing import Counter, List, Tuple

import pytest

from conftest import fixed_remaining, fixed_waiting
from sluice_agent import (InvalidRequest, Limiter, NoQuota, NotAllowed, NotYetValid, SluiceError,
                          Timeout, UnknownGrant)


def test_acquire_settle_with_a_context_manager(sock: str) -> None:
    lim = Limiter("fixed", caller="py-sync", socket=sock)
    before = fixed_remaining(sock)
    with lim.acquire(tokens=300, max_wait=0.5) as g:
        assert g.cost == {"requests": 1, "tokens": 300}
        assert fixed_remaining(sock) == {"requests": before["requests"] - 1, "tokens": before["tokens"] - 300}
        g.settle(tokens=120)
    assert fixed_remaining(sock) == {"requests": before["requests"] - 1, "tokens": before["tokens"] - 120}
    with pytest.raises(UnknownGrant):
        g.settle(tokens=1)
    g2 = lim.acquire(tokens=10)
    g2.cancel()  # the call was not made: everything goes back
    assert fixed_remaining(sock) == {"requests": before["requests"] - 1, "tokens": before["tokens"] - 120}
    g3 = lim.acquire(tokens=0)
    g3.settle(requests=0)  # undo the request too, for the other tests
    assert fixed_remaining(sock)["requests"] == before["requests"] - 1


def test_refusals_are_typed_and_change_nothing(sock: str) -> None:
    lim = Limiter("fixed", socket=sock)
    before = fixed_remaining(sock)
    with pytest.raises(NoQuota) as e:
        lim.acquire(tokens=1001, max_wait=1.0)  # more than the quota: never possible
    assert e.value.status == 429 and e.value.reason == "NO_QUOTA" and "tokens" in e.value.message
    with pytest.raises(Timeout):
        lim.acquire(tokens=before["tokens"] + 1, max_wait=0.5)  # the room comes back within the hour, not now
    with pytest.raises(InvalidRequest):
        lim.acquire(images=1)
    with pytest.raises(InvalidRequest):
        lim.acquire(tokens=-5)
    with pytest.raises(InvalidRequest):
        lim.acquire(max_wait=-1)
    with pytest.raises(TypeError):
        lim.acquire(tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(NotAllowed):
        Limiter("not-ours", socket=sock).acquire()
    with pytest.raises(UnknownGrant):
        Limiter("fixed", socket=sock)._t.request("POST", "/v1/settle", b'{"id":"g0-1"}')
    assert lim.try_acquire(tokens=before["tokens"] + 1) is None
    assert fixed_remaining(sock) == before


def test_reserve_then_cancel(sock: str) -> None:
    lim = Limiter("fixed", socket=sock)
    before = fixed_remaining(sock)
    r = lim.reserve(tokens=before["tokens"] + 1, max_wait=3600.0)  # the next hour's window
    assert r.delay > 0
    with pytest.raises(NotYetValid):
        r.settle(tokens=0)
    assert fixed_waiting(sock) == 1
    r.cancel()
    assert fixed_waiting(sock) == 0
    assert fixed_remaining(sock) == before


def test_shared_provider_through_configd(sock: str) -> None:
    lim = Limiter("llm", caller="py-llm", socket=sock)
    with lim.acquire(tokens=100, max_wait=2.0) as g:
        g.settle(tokens=40)
    st = lim.status()
    llm = next(p for p in st["providers"] if p["name"] == "llm")
    assert [l["dimension"] for l in llm["limits"]] == ["requests", "tokens"]
    # Created through configd naming no coordination: on the ledger.
    assert all(l["source"] == "ledger" for l in llm["limits"]), llm
    counts = next(c for c in st["callers"] if c["caller"] == "py-llm")["counts"]
    assert counts["acquire"]["OK"] >= 1 and counts["settle"]["OK"] >= 1


def _worker(sock: str, n: int, q: "multiprocessing.Queue[int]") -> None:
    lim = Limiter("llm", caller="py-proc", socket=sock)
    ok = 0
    for _ in range(n):
        if lim.try_acquire(tokens=1) is not None:
            ok += 1
    q.put(ok)


def test_processes_share_one_agent(sock: str) -> None:
    """Forked processes each get their own connection and together never
    take more than the share."""
    ctx = multiprocessing.get_context("fork")
    q: "multiprocessing.Queue[int]" = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(sock, 40, q)) for _ in range(4)]
    for p in ps:
        p.start()
    total = sum(q.get(timeout=60) for _ in ps)
    for p in ps:
        p.join()
        assert p.exitcode == 0
    assert 0 < total <= 160


def test_errors_carry_reason_and_status() -> None:
    e = SluiceError("X", "m", 500)
    assert str(e) == "X: m" and e.status == 500
    lim = Limiter("fixed", socket="/nonexistent/agent.sock")
    with pytest.raises(SluiceError) as ei:
        lim.acquire()
    assert ei.value.reason == "CLOSED"


def test_llm_workers_example_holds_the_limits(cluster, sock: str) -> None:  # type: ignore[no-untyped-def]
    """examples/python/llm_workers.py: 4 worker processes through the agent
    over two whole windows; none goes over a limit at the stub."""
    import os
    import subprocess
    import sys
    from conftest import ROOT
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "llm_workers.py"), "--socket", sock,
                          "--provider", "llm", "--workers", "4", "--windows", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "windows over a limit: 0 of 2" in out.stdout, out.stdout


def test_class_is_sent_and_checked(sock: str) -> None:
    before = fixed_remaining(sock)
    lim = Limiter("fixed", caller="py-class", class_="critical", socket=sock)
    lim.acquire(tokens=1, max_wait=0.5).cancel()
    g = lim.try_acquire(tokens=1, class_="batch")
    assert g is not None
    g.cancel()
    lim.reserve(tokens=1, max_wait=0.5, class_="nonesuch").cancel()  # a name the provider does not list: its default class
    # A name that is none is refused by the agent, whichever way it is given,
    # and takes nothing; a call's own class wins over its limiter's.
    bad = Limiter("fixed", class_="Critical!", socket=sock)
    for call in (lambda: bad.acquire(tokens=1, max_wait=0.5), lambda: bad.try_acquire(tokens=1),
                 lambda: bad.reserve(tokens=1, max_wait=0.5), lambda: lim.acquire(tokens=1, class_="9lives")):
        with pytest.raises(InvalidRequest) as e:
            call()
        assert e.value.reason == "BAD_REQUEST" and "class" in e.value.message
    bad.acquire(tokens=1, class_="critical").cancel()
    with pytest.raises(TypeError):
        lim.acquire(tokens=1, class_=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Limiter("fixed", class_=b"critical", socket=sock)  # type: ignore[arg-type]
    assert fixed_remaining(sock) == before


def test_class_keeps_its_reserve(cluster, sock: str) -> None:  # type: ignore[no-untyped-def]
    """A provider of 10 requests a second that keeps 60% for critical,
    set through configd and joined by the agent on first use: in one
    window, batch is refused at the reserve by try_acquire, acquire and
    reserve alike, and critical is admitted from it. A try counts from a
    fresh window, where batch takes exactly the 4 beyond the reserve (an
    agent that served no classes lets it take 10); one that began in a
    window already used, or that a boundary cut, is tried again."""
    from conftest import until, wait_share
    cluster.configd("set", "llm-tiered", "--limit", "10/1s", "--class", "critical=60%", "--class", "batch", "--coordination", "shares")
    batch = Limiter("llm-tiered", caller="py-batch", class_="batch", socket=sock)
    critical = Limiter("llm-tiered", caller="py-critical", class_="critical", socket=sock)
    try:
        batch.try_acquire()  # joins the provider
    except SluiceError:
        pass
    wait_share(sock, "llm-tiered")

    def one_window() -> bool:
        taken = 0
        while batch.try_acquire() is not None:
            taken += 1
        if taken != 4:
            return False  # not a fresh window: batch takes 4 of one, 6 are critical's
        for call in (lambda: batch.acquire(max_wait=0), lambda: batch.reserve(max_wait=0)):
            try:
                call()
                return False
            except Timeout:
                pass
        try:
            critical.acquire(max_wait=0)
            critical.reserve(max_wait=0)
        except Timeout:
            return False
        return critical.try_acquire() is not None

    until(one_window, "a window where batch is refused at critical's reserve and critical admitted")


def test_class_keeps_its_reserve_on_the_ledger(cluster, sock: str) -> None:  # type: ignore[no-untyped-def]
    """A ledger provider of 10 requests a second that keeps 60% for
    critical, through the agent: three batch callers flood it while one
    critical caller asks all the time. configd gives critical's reserve to
    the agent once the agent's record reports critical's demand
    (round.Target), so in every window that starts a window or more after
    configd has that demand (one round is a quarter of a window), critical
    is admitted its 6 and batch the rest, never more than 10 in all.

    (test_class_keeps_its_reserve cannot run on the ledger: there critical
    asks only in a window where batch took exactly 4, and with no demand
    of critical reported its reserve is lent to batch, which takes all 10.)

    Each answer is counted in the aligned window of the system clock (the
    ledger's windows are aligned to Unix time) that holds its call; one
    whose call straddles an edge may be of either window. So a window is
    held to what its counts show for certain: a critical caller refused in
    it had its reserve among the admissions that may be of it; those
    certainly of it add up to at most the limit; and those that may be of
    it to the limit, since batch always asks for the rest."""
    from conftest import until, wait_share
    name, limit, reserve = "llm-ledger-tiered", 10, 6
    cluster.configd("set", name, "--limit", f"{limit}/1s", "--class", "critical=60%", "--class", "batch", "--coordination", "ledger")
    try:
        Limiter(name, socket=sock).try_acquire()  # joins the provider
    except SluiceError:
        pass
    wait_share(sock, name)

    calls: List[Tuple[str, float, float, bool]] = []  # class, when the call began and was answered (time.time()), admitted
    failures: List[Exception] = []
    stop = threading.Event()

    def flood(class_: str) -> None:
        lim = Limiter(name, caller="py-ledger-" + class_, class_=class_, socket=sock)
        try:
            while not stop.is_set():
                began = time.time()
                admitted = lim.try_acquire() is not None
                calls.append((class_, began, time.time(), admitted))
                if not admitted:
                    time.sleep(0.001)  # still hundreds of asks a window, and cores left for the agent
        except Exception as e:  # raised by the test below, not lost with the thread
            failures.append(e)
        finally:
            lim.close()

    threads = [threading.Thread(target=flood, args=(c,), daemon=True) for c in ("batch", "batch", "batch", "critical")]
    for t in threads:
        t.start()
    try:
        def critical_demand() -> int:
            return sum(i["record"].get("class_demand", {}).get("critical", 0) for i in cluster.instances(name)["instances"])

        until(lambda: critical_demand() >= reserve or bool(failures), "configd has critical's demand in the agent's record")
        seen = time.time()
        first, n = math.ceil(seen + 1), 8  # windows of 1 s that start a whole window after the demand was seen
        until(lambda: bool(failures) or calls[-1][1] >= first + n, f"the callers asking past {n} more windows")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert not failures, failures

    certain: Counter[Tuple[int, str, bool]] = collections.Counter()  # window, class, admitted: calls within the window
    maybe: Counter[Tuple[int, str, bool]] = collections.Counter()  # and those that straddle one of its edges
    for class_, began, answered, admitted in calls:
        for k in range(math.floor(began), math.floor(answered) + 1):
            maybe[k, class_, admitted] += 1
        if math.floor(began) == math.floor(answered):
            certain[math.floor(began), class_, admitted] += 1
    tested = 0
    for k in range(first, first + n):
        got = {c: (certain[k, c, True], maybe[k, c, True], certain[k, c, False]) for c in ("critical", "batch")}
        what = f"window {k} ({k - seen:+.2f} s from the demand seen), admitted certainly, maybe, and refused: {got}"
        print(what)
        assert got["critical"][0] + got["batch"][0] <= limit, what + f": over the limit {limit}"
        assert got["critical"][1] + got["batch"][1] >= limit, what + ": batch did not take the rest"
        if got["critical"][2] > 0:
            tested += 1
            assert got["critical"][1] >= reserve, what + f": critical refused below its reserve {reserve}"
    assert tested >= n // 2, f"critical was refused in only {tested} of {n} windows: its demand did not last"
