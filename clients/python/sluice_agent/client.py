"""The synchronous client: one Limiter per provider, over the agent's Unix
socket (or loopback TCP with a token), with a keep-alive connection per
thread."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from . import _wire
from .errors import Closed, SluiceError

# How much longer than the wait asked for a request may take before the
# client gives up on the agent: the agent answers within the wait.
MARGIN = 10.0


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class Transport:
    """HTTP/1.1 to the agent, a connection per thread and process."""

    def __init__(self, socket_path: Optional[str] = None, url: Optional[str] = None, token: Optional[str] = None) -> None:
        if url is None and socket_path is None:
            socket_path = os.environ.get("SLUICE_AGENT_SOCKET", _wire.DEFAULT_SOCKET)
        self.where = url or socket_path or ""
        self._socket = socket_path if url is None else None
        self._hostport = _wire.split_url(url) if url else None
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = "Bearer " + token
        self._local = threading.local()

    def _conn(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        c = getattr(self._local, "conn", None)
        # A connection made before a fork belongs to the parent.
        if c is not None and self._local.pid == os.getpid():
            if c.sock is not None:
                c.sock.settimeout(timeout)
            c.timeout = timeout
            return c, c.sock is not None
        if self._socket is not None:
            c = _UnixConnection(self._socket, timeout)
        else:
            assert self._hostport is not None
            c = http.client.HTTPConnection(self._hostport[0], self._hostport[1], timeout=timeout)
        self._local.conn, self._local.pid = c, os.getpid()
        return c, False

    def request(self, method: str, path: str, body: Optional[bytes], wait: Optional[float] = None) -> Dict[str, Any]:
        timeout = (wait or 0.0) + MARGIN
        for attempt in (0, 1):
            c, reused = self._conn(timeout)
            try:
                c.request(method, path, body=body, headers=self._headers)
                resp = c.getresponse()
                data = resp.read()
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                c.close()
                self._local.conn = None
                # A kept connection the agent closed meanwhile (a restart)
                # fails at once: try a new one. The agent gives back what
                # it granted and could not deliver, so a second try takes
                # nothing twice.
                if reused and attempt == 0 and not isinstance(e, socket.timeout):
                    continue
                raise Closed("CLOSED", f"the agent at {self.where} did not answer: {e}") from e
            if resp.will_close:
                c.close()
                self._local.conn = None
            return _wire.answer(resp.status, data)
        raise AssertionError("unreachable")

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None


class Grant:
    """What one acquisition took, per dimension (``cost``). Settle it with
    what the call really cost, or cancel it if the call was not made; each
    at most once. As a context manager it is the grant itself: leaving the
    block unsettled keeps the charge, since the call may have reached the
    provider.
    """

    def __init__(self, limiter: "Limiter", id: str, cost: Mapping[str, int]) -> None:
        self.id = id
        self.cost: Dict[str, int] = dict(cost)
        self.done = False
        self._lim = limiter

    def settle(self, cost: Optional[Mapping[str, int]] = None, **kw: int) -> None:
        """Report the actual cost (``settle(tokens=512)``): what was
        charged too much goes back to its window; a dimension not named
        keeps its charge."""
        self._lim._t.request("POST", "/v1/settle", _wire.id_body(self.id, self._lim.caller, _wire.merge_cost(cost, kw)))
        self.done = True

    def cancel(self) -> None:
        """Give back everything, if its window is still open."""
        self._lim._t.request("POST", "/v1/cancel", _wire.id_body(self.id, self._lim.caller))
        self.done = True

    def __enter__(self) -> "Grant":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class Reservation(Grant):
    """Permits valid ``delay`` seconds after the reservation was made.
    ``wait()`` sleeps until then; as a context manager it waits on entry."""

    def __init__(self, limiter: "Limiter", id: str, cost: Mapping[str, int], delay: float) -> None:
        super().__init__(limiter, id, cost)
        self.delay = delay
        self.valid_at = time.monotonic() + delay

    def wait(self) -> None:
        """Sleep until the permits are valid. Interrupted before then (a
        KeyboardInterrupt), it cancels the reservation: the call will not
        be made."""
        d = self.valid_at - time.monotonic()
        try:
            if d > 0:
                time.sleep(d)
        except BaseException:
            try:
                self.cancel()
            except SluiceError:
                pass  # unreachable agent: the reservation is spent when it expires
            raise

    def __enter__(self) -> "Reservation":
        self.wait()
        return self


class Limiter:
    """A provider's limits as the local sluice agent enforces them.

    >>> lim = Limiter("llm", caller="worker-1")
    >>> with lim.acquire(tokens=800, max_wait=2.0) as g:
    ...     used = call_the_model()
    ...     g.settle(tokens=used)

    ``acquire`` waits up to ``max_wait`` seconds for every limit to have
    room for the cost (1 request unless it names requests, plus what it
    names: ``tokens=800``) and raises ``Timeout`` at once when the earliest
    permit lies further away. Safe for use from several threads; each
    process and thread has its own connection.

    ``class_`` names the priority class of the calls ("critical"), for
    every call of the limiter or for one (``acquire(class_="batch")``,
    which wins). The agent refuses a name that is no class name
    (``InvalidRequest``); one the provider does not list is its default
    class.
    """

    def __init__(self, provider: str, *, caller: str = "", class_: Optional[str] = None,
                 socket: Optional[str] = None, url: Optional[str] = None, token: Optional[str] = None) -> None:
        self.provider = provider
        self.caller = caller
        self.class_ = _wire.pick_class(class_, None)
        self._t = Transport(socket, url, token)

    def acquire(self, cost: Optional[Mapping[str, int]] = None, *, max_wait: float = 0.0,
                class_: Optional[str] = None, **kw: int) -> Grant:
        c = _wire.merge_cost(cost, kw)
        k = _wire.pick_class(class_, self.class_)
        out = self._t.request("POST", "/v1/acquire", _wire.acquire_body(self.provider, self.caller, c, max_wait, k), max_wait)
        return Grant(self, out["grant"], out.get("cost", {}))

    def try_acquire(self, cost: Optional[Mapping[str, int]] = None, *, class_: Optional[str] = None, **kw: int) -> Optional[Grant]:
        """The grant if every limit has room now, else None; never waits."""
        c = _wire.merge_cost(cost, kw)
        k = _wire.pick_class(class_, self.class_)
        try:
            out = self._t.request("POST", "/v1/try_acquire", _wire.acquire_body(self.provider, self.caller, c, None, k))
        except Exception as e:
            if getattr(e, "reason", "") == "TIMEOUT":
                return None
            raise
        return Grant(self, out["grant"], out.get("cost", {}))

    def reserve(self, cost: Optional[Mapping[str, int]] = None, *, max_wait: float = 0.0,
                class_: Optional[str] = None, **kw: int) -> Reservation:
        c = _wire.merge_cost(cost, kw)
        k = _wire.pick_class(class_, self.class_)
        out = self._t.request("POST", "/v1/reserve", _wire.acquire_body(self.provider, self.caller, c, max_wait, k))
        return Reservation(self, out["reservation"], out.get("cost", {}), float(out.get("delay_ms", 0.0)) / 1000.0)

    def status(self) -> Dict[str, Any]:
        """The agent's status: providers, limits, callers."""
        return self._t.request("GET", "/v1/status", None)

    def close(self) -> None:
        """Close this thread's connection."""
        self._t.close()

    def __enter__(self) -> "Limiter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
