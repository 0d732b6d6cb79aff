"""Tokens: HS256 JWTs carrying agent id, namespace and scopes."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import jwt

from memento_sessions.errors import AuthError as AuthError  # defined in errors; this name kept for importers
from memento_sessions.errors import Forbidden

SCOPES = ("sessions:read", "sessions:write", "kg:write", "admin")
DEFAULT_SCOPE = "sessions:read sessions:write"
_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# `ns` is required: a token that names no namespace must not silently land in `default`.
REQUIRED = ("exp", "sub", "ns")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the token's agent, namespace and scopes."""

    agent_id: str
    namespace: str
    scopes: frozenset[str]
    # The token's `exp` (epoch seconds): a WebSocket is closed when it passes.
    expires_at: float | None = field(default=None, compare=False)

    def require(self, scope: str) -> None:
        """Raise Forbidden unless the token carries `scope` (admin carries every scope)."""
        if scope not in self.scopes and "admin" not in self.scopes:
            raise Forbidden(f"token lacks scope {scope}", {"scope": scope})


def issue_token(secret: str, agent_id: str, namespace: str = "default",
                scope: str = DEFAULT_SCOPE, ttl: int = 86400) -> str:
    """Sign a token for `agent_id`; raises ValueError on a bad agent, namespace or scope."""
    if not _NAME.match(agent_id):
        raise ValueError("agent id must be 1..128 chars of [A-Za-z0-9._:-]")
    if not _NAMESPACE.match(namespace):
        raise ValueError("namespace must be 1..64 chars of [A-Za-z0-9_-]")
    unknown = set(scope.split()) - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope {' '.join(sorted(unknown))}; allowed: {' '.join(SCOPES)}")
    claims = {"sub": agent_id, "ns": namespace, "scope": scope, "exp": int(time.time()) + ttl}
    return jwt.encode(claims, secret, algorithm="HS256")


def verify_token(secret: str, token: str | None) -> Identity:
    """Check signature and expiry and return the identity; raises AuthError."""
    if not token:
        raise AuthError("missing token")
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], options={"require": list(REQUIRED)})
    except jwt.ExpiredSignatureError as exc:
        raise AuthError("token expired") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise AuthError(f"invalid token: no {exc.claim!r} claim") from exc
    except jwt.PyJWTError as exc:
        raise AuthError("invalid token") from exc
    return _identity(claims)


def _identity(claims: dict[str, object]) -> Identity:
    agent, ns, scope = claims.get("sub"), claims.get("ns"), claims.get("scope", "")
    if not isinstance(agent, str) or not _NAME.match(agent):
        raise AuthError("invalid token subject")
    if not isinstance(ns, str) or not _NAMESPACE.match(ns):
        raise AuthError("invalid token namespace")
    if not isinstance(scope, str):
        raise AuthError("invalid token scope")
    exp = claims.get("exp")
    return Identity(agent, ns, frozenset(scope.split()), float(exp) if isinstance(exp, int | float) else None)


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if any."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None
