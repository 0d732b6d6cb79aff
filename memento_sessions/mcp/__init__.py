"""The MCP transport: every JSON-RPC method as an MCP tool, over streamable HTTP (/mcp) and stdio.

tools.py (the tools built from api/'s declared table, each running its method through the registry),
http.py (/mcp, built on its first request: the SDK costs a CPU second to import),
streamable.py (the SDK's app that http.py builds, behind bearer auth), stdio.py (the tools on stdio, as
MEMENTO_TOKEN's agent; the command that opens the services for it is server/stdio.py), quota.py (the
per-identity cap on MCP sessions).

Absolute imports only: inside this package `import mcp` is still the MCP SDK. May import the shared
ground, the embedded/ data dir and api/ (the declared tools, their arguments and results) and what is
below it; not ws/ nor server/.
"""
