"""The asyncio client: AsyncLimiter, over the agent's Unix socket (or
loopback TCP with a token). A task cancelled while it waits closes its
connection, and the agent gives the permits back."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Dict, Generator, List, Mapping, Optional, Tuple

from . import _wire
from .client import MARGIN
from .errors import Closed

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

    async def request(self, method: str, path: str, body: Optional[bytes], wait: Optional[float] = None) -> Dict[str, Any]:
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
            except BaseException as e:
                # Cancelled, timed out or cut: the connection's state is
                # unknown, so it goes; its end tells the agent to give
                # back a wait's permits.
                w.close()
                if isinstance(e, (ConnectionError, asyncio.IncompleteReadError)) and reused and attempt == 0:
                    continue
                if isinstance(e, (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError)):
                    raise Closed("CLOSED", f"the agent at {self.where} did not answer: {e!r}") from e
                raise
            if keep:
                self._idle.append((r, w))
            else:
                w.close()
            return _wire.answer(status, data)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        while self._idle:
            _, w = self._idle.pop()
            w.close()


async def _read(r: asyncio.StreamReader) -> Tuple[int, bool, bytes]:
    line = await r.readuntil(b"\r\n")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP answer: {line[:80]!r}")
    status = int(parts[1])
    length, keep = 0, True
    while True:
        h = await r.readuntil(b"\r\n")
        if h == b"\r\n":
            break
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"connection" and value.strip().lower() == b"close":
            keep = False
        elif name == b"transfer-encoding":
            raise ConnectionError("chunked answers are not expected from the agent")
    return status, keep, await r.readexactly(length)


class AsyncGrant:
    """What one acquisition took (``cost``); settle or cancel it once."""

    def __init__(self, limiter: "AsyncLimiter", id: str, cost: Mapping[str, int]) -> None:
        self.id = id
        self.cost: Dict[str, int] = dict(cost)
        self.done = False
        self._lim = limiter

    async def settle(self, cost: Optional[Mapping[str, int]] = None, **kw: int) -> None:
        await self._lim._t.request("POST", "/v1/settle", _wire.id_body(self.id, self._lim.caller, _wire.merge_cost(cost, kw)))
        self.done = True

    async def cancel(self) -> None:
        await self._lim._t.request("POST", "/v1/cancel", _wire.id_body(self.id, self._lim.caller))
        self.done = True


class _Acquiring:
    """An acquisition: await it for the grant, or ``async with`` it."""

    def __init__(self, coro: Any) -> None:
        self._coro = coro
        self._grant: Optional[AsyncGrant] = None

    def __await__(self) -> Generator[Any, None, AsyncGrant]:
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncGrant:
        self._grant = await self._coro
        return self._grant

    async def __aexit__(self, *exc: Any) -> None:
        return None


class AsyncLimiter:
    """A provider's limits as the local agent enforces them, for asyncio.

    >>> lim = AsyncLimiter("llm", caller="worker-1")
    >>> async with lim.acquire(tokens=800, max_wait=2.0) as g:
    ...     used = await call_the_model()
    ...     await g.settle(tokens=used)

    Use it from one event loop. Semantics as Limiter's.
    """

    def __init__(self, provider: str, *, caller: str = "", socket: Optional[str] = None,
                 url: Optional[str] = None, token: Optional[str] = None) -> None:
        self.provider = provider
        self.caller = caller
        self._t = AsyncTransport(socket, url, token)

    def acquire(self, cost: Optional[Mapping[str, int]] = None, *, max_wait: float = 0.0, **kw: int) -> _Acquiring:
        c = _wire.merge_cost(cost, kw)
        return _Acquiring(self._acquire("/v1/acquire", c, max_wait))

    async def _acquire(self, path: str, c: Dict[str, int], max_wait: Optional[float]) -> AsyncGrant:
        out = await self._t.request("POST", path, _wire.acquire_body(self.provider, self.caller, c, max_wait), max_wait)
        return AsyncGrant(self, out["grant"], out.get("cost", {}))

    async def try_acquire(self, cost: Optional[Mapping[str, int]] = None, **kw: int) -> Optional[AsyncGrant]:
        """The grant if every limit has room now, else None; never waits."""
        try:
            return await self._acquire("/v1/try_acquire", _wire.merge_cost(cost, kw), None)
        except Exception as e:
            if getattr(e, "reason", "") == "TIMEOUT":
                return None
            raise

    async def status(self) -> Dict[str, Any]:
        return await self._t.request("GET", "/v1/status", None)

    async def aclose(self) -> None:
        await self._t.aclose()

    async def __aenter__(self) -> "AsyncLimiter":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
