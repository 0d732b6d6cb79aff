"""The live dashboard: a static page at `/` and its assets under `/dashboard/`, talking only to `/ws`.

The files ship inside the package (no build step, nothing fetched from elsewhere) and are read once, at
import: they are small, and serving them from memory keeps a disk read off every page load.

A leaf: it imports nothing else of the package; server/app.py mounts its routes.
"""

from __future__ import annotations

import hashlib
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "usage.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page loads nothing but its own files and opens only WebSockets (to its own origin, by the code);
# no inline script or style can run, so an event's text rendered on the page cannot become code.
CSP = ("default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; object-src 'none'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    # "no-cache" revalidates by ETag on every load: a daemon upgrade never pairs an old app.js with a new page.
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # A first load may carry ?token=: no Referer header may ever repeat that URL to anyone.
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class Asset:
    """One static file held in memory with its strong ETag."""

    def __init__(self, name: str) -> None:
        self.body = files(__name__).joinpath(name).read_bytes()
        self.media_type = TYPES[name]
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:32] + '"'

    def respond(self, request: Request) -> Response:
        """The file, or 304 when the browser's copy is current."""
        headers = {**HEADERS, "ETag": self.etag}
        if self.etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


ASSETS = {name: Asset(name) for name in TYPES}


async def index(request: Request) -> Response:
    """`GET /`: the page."""
    return ASSETS["index.html"].respond(request)


async def asset(request: Request) -> Response:
    """`GET /dashboard/<name>`: one of the page's files; any other name is 404 (no path is ever joined)."""
    found = ASSETS.get(request.path_params["name"])
    if found is None:
        return PlainTextResponse("not found", status_code=404, headers=HEADERS)
    return found.respond(request)


def routes() -> list[BaseRoute]:
    """The dashboard's routes, to add to the daemon's router."""
    return [
        Route("/", index, methods=["GET", "HEAD"]),
        Route("/dashboard/{name}", asset, methods=["GET", "HEAD"]),
    ]
