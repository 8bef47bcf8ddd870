"""What both transports share: request bodies, answers, paths."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Tuple

from .errors import SluiceError, error_for

DEFAULT_SOCKET = "/run/sluice/agent.sock"


def acquire_body(provider: str, caller: str, cost: Mapping[str, int], max_wait: Optional[float],
                 class_: Optional[str] = None) -> bytes:
    body: Dict[str, Any] = {"provider": provider}
    if caller:
        body["caller"] = caller
    if cost:
        body["cost"] = dict(cost)
    if max_wait:
        body["max_wait_ms"] = max_wait * 1000.0
    if class_:
        body["class"] = class_
    return json.dumps(body).encode()


def pick_class(call: Optional[str], default: Optional[str]) -> Optional[str]:
    """The class a call names: its own, else its limiter's. The agent
    checks the name (InvalidRequest); only its type is checked here."""
    c = default if call is None else call
    if c is not None and not isinstance(c, str):
        raise TypeError(f"class_: want a str, got {c!r}")
    return c


def id_body(id: str, caller: str, cost: Optional[Mapping[str, int]] = None) -> bytes:
    body: Dict[str, Any] = {"id": id}
    if caller:
        body["caller"] = caller
    if cost:
        body["cost"] = dict(cost)
    return json.dumps(body).encode()


def merge_cost(cost: Optional[Mapping[str, int]], kw: Mapping[str, int]) -> Dict[str, int]:
    out: Dict[str, int] = dict(cost or {})
    out.update(kw)
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"cost {k}: want an int, got {v!r}")
    return out


def answer(status: int, data: bytes) -> Dict[str, Any]:
    """The decoded answer, or the typed error it carries."""
    try:
        out = json.loads(data) if data else {}
    except ValueError:
        raise SluiceError("INTERNAL", f"answer is not JSON: {data[:200]!r}", status) from None
    if status != 200:
        if isinstance(out, dict) and "error" in out:
            raise error_for(str(out["error"]), str(out.get("message", "")), status)
        raise SluiceError("INTERNAL", f"HTTP {status}: {data[:200]!r}", status)
    return out


def split_url(url: str) -> Tuple[str, int]:
    """host and port of an http://host:port URL (the agent's TCP API)."""
    if not url.startswith("http://"):
        raise ValueError(f"url {url!r}: want http://127.0.0.1:PORT")
    hostport = url[len("http://"):].rstrip("/")
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)
