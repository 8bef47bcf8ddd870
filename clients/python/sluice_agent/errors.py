"""Typed refusals of the sluice agent, one class per reason it gives."""

from __future__ import annotations

from typing import Dict, Type


class SluiceError(Exception):
    """A request the agent refused, or could not be asked.

    ``reason`` is the agent's reason ("TIMEOUT", "NO_QUOTA", ...), ``status``
    the HTTP status (0 when the agent could not be reached), ``message`` what
    it said. A refused request changed nothing.
    """

    def __init__(self, reason: str, message: str, status: int = 0) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.status = status


class Timeout(SluiceError):
    """No permit within the allowed wait; decided at once, nothing taken."""


class NoQuota(Timeout):
    """The quota in force is below the cost (no share yet, or too large a cost)."""


class Canceled(SluiceError):
    """The wait was cancelled; the permits went back."""


class Closed(SluiceError):
    """The agent is shutting down, or could not be reached."""


class InvalidRequest(SluiceError):
    """A malformed request or an argument out of range (BAD_REQUEST, INVALID, TOO_LARGE)."""


class NotAllowed(SluiceError):
    """The provider is not the agent's, or the token is missing (PROVIDER_NOT_ALLOWED, UNAUTHENTICATED)."""


class UnknownGrant(SluiceError):
    """The grant was settled or cancelled already, or expired."""


class NotYetValid(SluiceError):
    """A reservation was settled before it became valid."""


_BY_REASON: Dict[str, Type[SluiceError]] = {
    "TIMEOUT": Timeout,
    "NO_QUOTA": NoQuota,
    "CANCELED": Canceled,
    "CLOSED": Closed,
    "INVALID": InvalidRequest,
    "BAD_REQUEST": InvalidRequest,
    "TOO_LARGE": InvalidRequest,
    "NOT_FOUND": InvalidRequest,
    "METHOD_NOT_ALLOWED": InvalidRequest,
    "PROVIDER_NOT_ALLOWED": NotAllowed,
    "TOO_MANY_PROVIDERS": NotAllowed,
    "UNAUTHENTICATED": NotAllowed,
    "UNKNOWN_GRANT": UnknownGrant,
    "NOT_YET_VALID": NotYetValid,
}


def error_for(reason: str, message: str, status: int) -> SluiceError:
    """The exception of the agent's reason (SluiceError for one unknown)."""
    return _BY_REASON.get(reason, SluiceError)(reason, message, status)
