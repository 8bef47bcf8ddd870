"""Client of sluice's local agent (``sluice-agent``): acquire permits of a
provider's limits -- shared by every process of a fleet through the
agents' shares -- before calling it, and settle what the call really cost.

    from sluice_agent import Limiter, Timeout

    lim = Limiter("llm", caller="worker-1")          # /run/sluice/agent.sock
    with lim.acquire(tokens=800, max_wait=2.0) as g:
        used = call_the_model()
        g.settle(tokens=used)

AsyncLimiter is the same for asyncio. Standard library only.
"""

from .aio import AsyncGrant, AsyncLimiter, AsyncReservation
from .client import Grant, Limiter, Reservation
from .errors import (Canceled, Closed, InvalidRequest, NotAllowed, NotYetValid, NoQuota, SluiceError, Timeout,
                     UnknownGrant)

__all__ = [
    "AsyncGrant", "AsyncLimiter", "AsyncReservation", "Canceled", "Closed", "Grant", "InvalidRequest", "Limiter", "NoQuota",
    "NotAllowed", "NotYetValid", "Reservation", "SluiceError", "Timeout", "UnknownGrant",
]
