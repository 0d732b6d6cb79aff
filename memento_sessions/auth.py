"""Tokens: HS256 JWTs carrying agent id, namespace, scopes and (optionally) roles."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace

import jwt

from memento_sessions.errors import AuthError as AuthError  # defined in errors; this name kept for importers
from memento_sessions.errors import Forbidden

SCOPES = ("sessions:read", "sessions:write", "kg:write", "admin")
DEFAULT_SCOPE = "sessions:read sessions:write"
_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ROLE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # one role name (a Redis key part: no ':' nor braces)
MAX_ROLES = 16
# `ns` is required: a token that names no namespace must not silently land in `default`.
REQUIRED = ("exp", "sub", "ns")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the token's agent, namespace, scopes and roles (mailbox.send to `role:<name>`)."""

    agent_id: str
    namespace: str
    scopes: frozenset[str]
    # The token's `exp` (epoch seconds): a WebSocket is closed when it passes.
    expires_at: float | None = field(default=None, compare=False)
    roles: frozenset[str] = frozenset()

    def require(self, scope: str) -> None:
        """Raise Forbidden unless the token carries `scope` (admin carries every scope)."""
        if scope not in self.scopes and "admin" not in self.scopes:
            raise Forbidden(f"token lacks scope {scope}", {"scope": scope})


def issue_token(secret: str, agent_id: str, namespace: str = "default",
                scope: str = DEFAULT_SCOPE, ttl: int = 86400, roles: tuple[str, ...] = ()) -> str:
    """Sign a token for `agent_id`; raises ValueError on a bad agent, namespace, scope or role."""
    if not _NAME.fullmatch(agent_id):
        raise ValueError("agent id must be 1..128 chars of [A-Za-z0-9._:-]")
    if not _NAMESPACE.fullmatch(namespace):
        raise ValueError("namespace must be 1..64 chars of [A-Za-z0-9_-]")
    unknown = set(scope.split()) - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope {' '.join(sorted(unknown))}; allowed: {' '.join(SCOPES)}")
    problem = roles_problem(list(roles))
    if problem:
        raise ValueError(problem)
    claims: dict[str, object] = {"sub": agent_id, "ns": namespace, "scope": scope, "exp": int(time.time()) + ttl}
    if roles:
        claims["roles"] = list(roles)
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
    if not isinstance(agent, str) or not _NAME.fullmatch(agent):
        raise AuthError("invalid token subject")
    if not isinstance(ns, str) or not _NAMESPACE.fullmatch(ns):
        raise AuthError("invalid token namespace")
    if not isinstance(scope, str):
        raise AuthError("invalid token scope")
    roles = claims.get("roles", [])
    problem = roles_problem(roles)
    if problem:
        raise AuthError(f"invalid token roles: {problem}")
    exp = claims.get("exp")
    return Identity(agent, ns, frozenset(scope.split()), float(exp) if isinstance(exp, int | float) else None,
                    frozenset(roles) if isinstance(roles, list) else frozenset())


def roles_problem(roles: object) -> str | None:
    """What is wrong with a `roles` claim (a list of up to MAX_ROLES role names), or None. A bad claim
    refuses the token rather than being ignored: the agent would silently miss the role's messages."""
    if not isinstance(roles, list):
        return "must be a list of role names"
    if len(roles) > MAX_ROLES:
        return f"at most {MAX_ROLES} roles"
    for role in roles:
        if not isinstance(role, str) or not ROLE.fullmatch(role):
            return f"{role!r} is not 1..64 chars of [A-Za-z0-9._-]"
    return None


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if any."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None

# A Claude Code session as its own agent of the token: `<sub>:<first SHORT letters/digits of the session id>`.
SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
SHORT = 8  # characters of a session id in its agent's id
RESERVED = ("role", "session")  # recipients' prefixes: such a subject keeps one agent for all its sessions


def session_agent(who: Identity, session_id: str) -> Identity:
    """The caller acting as its Claude Code session: `<sub>:<first 8 of the session id>` in its own namespace.
    Left as it is when that id would be too long or read as a recipient prefix (a subject `role` or `session`),
    and when it already is that session's agent."""
    short = re.sub(r"[^A-Za-z0-9]", "", session_id)[:SHORT]
    agent = f"{who.agent_id}:{short}"
    if not short or len(agent) > 128 or who.agent_id in RESERVED or who.agent_id.endswith(f":{short}"):
        return who  # (the last: already that session's agent, as a connection opened with ?session= is)
    return replace(who, agent_id=agent)
