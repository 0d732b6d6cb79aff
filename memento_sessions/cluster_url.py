"""`redis+cluster://[user:password@]host:port[,host:port...]`: the seed nodes of a Redis Cluster, taken apart.

Parsed when the settings are read, so a bad URL stops the daemon before it starts any server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

SCHEME = "redis+cluster://"
_NODE = re.compile(r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def is_cluster(url: str | None) -> bool:
    """Whether `url` names a Redis Cluster."""
    return url is not None and url.startswith(SCHEME)


@dataclass(frozen=True)
class ClusterUrl:
    """Seed nodes (any of the cluster's nodes: the topology is read from them) and the credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> ClusterUrl:
        """Take a `redis+cluster://` URL apart; ValueError says what is wrong with it."""
        if not is_cluster(url):
            raise ValueError(f"a Redis Cluster URL starts with {SCHEME}")
        rest = url[len(SCHEME):]
        rest, _, path = rest.partition("/")
        if path not in ("", "0"):
            raise ValueError(f"a Redis Cluster has only database 0, not {path!r}")
        userinfo, _, hosts = rest.rpartition("@")
        username, _, password = userinfo.partition(":")
        nodes = tuple(_node(item) for item in hosts.split(","))
        return cls(nodes, unquote(username) or None, unquote(password) or None)

    def node_url(self, host: str, port: int) -> str:
        """A `redis://` URL of one node, with the credentials."""
        user, password = quote(self.username or "", safe=""), quote(self.password or "", safe="")
        auth = f"{user}:{password}@" if user or password else ""
        return f"redis://{auth}{host}:{port}/0"


def _node(item: str) -> tuple[str, int]:
    match = _NODE.fullmatch(item.strip())
    if match is None:
        raise ValueError(f"{item!r} is not host:port (the URL is redis+cluster://host:port[,host:port...])")
    port = int(match["port"])
    if not 0 < port < 65536:
        raise ValueError(f"{item!r}: the port must be 1-65535")
    return match["host"].strip("[]"), port
