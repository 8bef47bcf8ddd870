"""The asyncio client: AsyncLimiter, over the agent's Unix socket (or
loopback TCP with a token), with asyncio streams and nothing else. A task
cancelled while the agent makes it wait closes its connection, and the
agent gives the permits back; one cancelled while it waits for a
reservation to become valid cancels the reservation."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Coroutine, Dict, Generator, Generic, List, Mapping, Optional, Tuple, TypeVar

from . import _wire
from .client import MARGIN
from .errors import Closed, SluiceError

_Conn = Tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AsyncTransport:
    """HTTP/1.1 over a pool of kept connections, one request at a time on each."""

    def __init__(self, socket_path: Optional[str] = None, url: Optional[str] = None, token: Optional[str] = None) -> None:
        if url is None and socket_path is None:
            socket_path = os.environ.get("SLUICE_AGENT_SOCKET", _wire.DEFAULT_SOCKET)
        self.where = url or socket_path or ""
        self._socket = socket_path if url is None else None
        self._hostport = _wire.split_url(url) if url else None
        self._auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._idle: List[_Conn] = []

    async def _open(self) -> _Conn:
        if self._socket is not None:
            return await asyncio.open_unix_connection(self._socket)
        assert self._hostport is not None
        return await asyncio.open_connection(*self._hostport)

    async def request(self, method: str, path: str, body: Optional[bytes], wait: Optional[float] = None,
                      takes: bool = False) -> Dict[str, Any]:
        """One exchange. ``takes`` marks a request that takes permits
        (acquire, try_acquire, reserve): cancelled before its answer is
        read, it gives back what the agent may have granted meanwhile."""
        body = body or b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"{self._auth}Content-Length: {len(body)}\r\n\r\n").encode()
        for attempt in (0, 1):
            reused = bool(self._idle)
            try:
                r, w = self._idle.pop() if reused else await self._open()
            except OSError as e:
                raise Closed("CLOSED", f"the agent at {self.where} did not answer: {e}") from e
            try:
                w.write(head + body)
                await w.drain()
                status, keep, data = await asyncio.wait_for(_read(r), (wait or 0.0) + MARGIN)
            except asyncio.CancelledError:
                if takes:
                    # Shielded: a second cancel must not cut the give-back short.
                    await asyncio.shield(self._give_back(r, w))
                else:
                    w.close()
                raise
            except BaseException as e:
                # Cancelled, timed out or cut: the connection's state is
                # unknown, so it goes; its end tells the agent to give
                # back a wait's permits.
                w.close()
                if isinstance(e, (ConnectionError, asyncio.IncompleteReadError)) and reused and attempt == 0:
                    continue
                if isinstance(e, (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                                  asyncio.TimeoutError, OSError)):
                    raise Closed("CLOSED", f"the agent at {self.where} did not answer: {e!r}") from e
                raise
            if keep:
                self._idle.append((r, w))
            else:
                w.close()
            return _wire.answer(status, data)
        raise AssertionError("unreachable")

    async def _give_back(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """After a cancelled acquisition. Ending our half of the connection
        ends the agent's wait (it answers CANCELED and keeps nothing); but
        the agent may have granted just before, and its answer be on its
        way: that grant is cancelled."""
        id = ""
        try:
            if w.can_write_eof():
                w.write_eof()
            status, _, data = await asyncio.wait_for(_read(r), MARGIN)
            if status == 200:
                out = json.loads(data)
                id = str(out.get("grant") or out.get("reservation") or "")
        except (ConnectionError, EOFError, asyncio.LimitOverrunError, asyncio.TimeoutError, OSError, ValueError):
            pass  # no answer: the agent saw the end first and kept nothing
        finally:
            w.close()
        if id:
            try:
                await self.request("POST", "/v1/cancel", _wire.id_body(id, ""))
            except SluiceError:
                pass  # unreachable: the grant stays charged, as a crash would leave it

    async def aclose(self) -> None:
        while self._idle:
            _, w = self._idle.pop()
            w.close()


async def _read(r: asyncio.StreamReader) -> Tuple[int, bool, bytes]:
    line = await r.readuntil(b"\r\n")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP answer: {line[:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise ConnectionError(f"not an HTTP status: {line[:80]!r}") from None
    length, keep = 0, True
    while True:
        h = await r.readuntil(b"\r\n")
        if h == b"\r\n":
            break
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise ConnectionError(f"bad Content-Length: {value[:40]!r}") from None
            if length < 0:
                raise ConnectionError(f"bad Content-Length: {length}")
        elif name == b"connection" and value.strip().lower() == b"close":
            keep = False
        elif name == b"transfer-encoding":
            raise ConnectionError("chunked answers are not expected from the agent")
    return status, keep, await r.readexactly(length)


class AsyncGrant:
    """What one acquisition took, per dimension (``cost``). Settle it with
    what the call really cost, or cancel it if the call was not made; each
    at most once. Leaving an ``async with`` block unsettled keeps the
    charge, since the call may have reached the provider."""

    def __init__(self, limiter: "AsyncLimiter", id: str, cost: Mapping[str, int]) -> None:
        self.id = id
        self.cost: Dict[str, int] = dict(cost)
        self.done = False
        self._lim = limiter

    async def settle(self, cost: Optional[Mapping[str, int]] = None, **kw: int) -> None:
        """Report the actual cost (``await g.settle(tokens=512)``): what was
        charged too much goes back to its window; a dimension not named
        keeps its charge."""
        await self._lim._t.request("POST", "/v1/settle", _wire.id_body(self.id, self._lim.caller, _wire.merge_cost(cost, kw)))
        self.done = True

    async def cancel(self) -> None:
        """Give back everything, if its window is still open."""
        await self._lim._t.request("POST", "/v1/cancel", _wire.id_body(self.id, self._lim.caller))
        self.done = True

    async def __aenter__(self) -> "AsyncGrant":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None


class AsyncReservation(AsyncGrant):
    """Permits valid ``delay`` seconds after the reservation was made.
    ``await r.wait()`` sleeps until then; ``async with`` waits on entry.
    A wait cancelled before the permits are valid cancels the reservation:
    the call will not be made, so nothing should stay charged for it."""

    def __init__(self, limiter: "AsyncLimiter", id: str, cost: Mapping[str, int], delay: float) -> None:
        super().__init__(limiter, id, cost)
        self.delay = delay
        self.valid_at = time.monotonic() + delay

    async def wait(self) -> None:
        d = self.valid_at - time.monotonic()
        try:
            if d > 0:
                await asyncio.sleep(d)
        except asyncio.CancelledError:
            # Shielded: a second cancel must not cut the give-back short.
            # If the agent cannot be asked, the reservation is spent when
            # its grant expires; the cancellation is what the caller sees.
            try:
                await asyncio.shield(self.cancel())
            except SluiceError:
                pass
            raise

    async def __aenter__(self) -> "AsyncReservation":
        await self.wait()
        return self


_G = TypeVar("_G", bound="AsyncGrant")


class _Pending(Generic[_G]):
    """An acquisition or reservation under way: await it for the grant, or
    ``async with`` it (a reservation then also waits until valid)."""

    def __init__(self, coro: Coroutine[Any, Any, _G]) -> None:
        self._coro = coro

    def __await__(self) -> Generator[Any, None, _G]:
        return self._coro.__await__()

    async def __aenter__(self) -> _G:
        g = await self._coro
        await g.__aenter__()
        return g

    async def __aexit__(self, *exc: Any) -> None:
        return None


class AsyncLimiter:
    """A provider's limits as the local agent enforces them, for asyncio.

    >>> lim = AsyncLimiter("llm", caller="worker-1")
    >>> async with lim.acquire(tokens=800, max_wait=2.0) as g:
    ...     used = await call_the_model()
    ...     await g.settle(tokens=used)

    Semantics as Limiter's: ``acquire`` waits up to ``max_wait`` seconds
    for every limit to have room and raises ``Timeout`` at once when the
    earliest permit lies further away. Each request in flight has a
    connection of its own, so many tasks can wait at once; use an
    AsyncLimiter from one event loop. ``class_`` names the calls'
    priority class, as Limiter's does.
    """

    def __init__(self, provider: str, *, caller: str = "", class_: Optional[str] = None,
                 socket: Optional[str] = None, url: Optional[str] = None, token: Optional[str] = None) -> None:
        self.provider = provider
        self.caller = caller
        self.class_ = _wire.pick_class(class_, None)
        self._t = AsyncTransport(socket, url, token)

    def acquire(self, cost: Optional[Mapping[str, int]] = None, *, max_wait: float = 0.0,
                class_: Optional[str] = None, **kw: int) -> "_Pending[AsyncGrant]":
        c = _wire.merge_cost(cost, kw)
        k = _wire.pick_class(class_, self.class_)
        return _Pending(self._acquire(c, max_wait, k))

    async def _acquire(self, c: Dict[str, int], max_wait: float, k: Optional[str]) -> AsyncGrant:
        out = await self._t.request("POST", "/v1/acquire", _wire.acquire_body(self.provider, self.caller, c, max_wait, k), max_wait,
                                   takes=True)
        return AsyncGrant(self, out["grant"], out.get("cost", {}))

    async def try_acquire(self, cost: Optional[Mapping[str, int]] = None, *, class_: Optional[str] = None, **kw: int) -> Optional[AsyncGrant]:
        """The grant if every limit has room now, else None; never waits."""
        c = _wire.merge_cost(cost, kw)
        k = _wire.pick_class(class_, self.class_)
        try:
            out = await self._t.request("POST", "/v1/try_acquire", _wire.acquire_body(self.provider, self.caller, c, None, k),
                                       takes=True)
        except SluiceError as e:
            if e.reason == "TIMEOUT":
                return None
            raise
        return AsyncGrant(self, out["grant"], out.get("cost", {}))

    def reserve(self, cost: Optional[Mapping[str, int]] = None, *, max_wait: float = 0.0,
                class_: Optional[str] = None, **kw: int) -> "_Pending[AsyncReservation]":
        """Take the cost at the earliest instant within ``max_wait`` at
        which every limit has room; answers at once with the reservation.
        ``async with lim.reserve(...) as r`` also waits until it is valid."""
        c = _wire.merge_cost(cost, kw)
        k = _wire.pick_class(class_, self.class_)
        return _Pending(self._reserve(c, max_wait, k))

    async def _reserve(self, c: Dict[str, int], max_wait: float, k: Optional[str]) -> AsyncReservation:
        out = await self._t.request("POST", "/v1/reserve", _wire.acquire_body(self.provider, self.caller, c, max_wait, k),
                                   takes=True)
        return AsyncReservation(self, out["reservation"], out.get("cost", {}), float(out.get("delay_ms", 0.0)) / 1000.0)

    async def status(self) -> Dict[str, Any]:
        """The agent's status: providers, limits, callers."""
        return await self._t.request("GET", "/v1/status", None)

    async def aclose(self) -> None:
        """Close the kept connections."""
        await self._t.aclose()

    async def __aenter__(self) -> "AsyncLimiter":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
