"""The API, declared once: every JSON-RPC method with its params, result, scope, handler, steps and MCP tools.

spec.py       what a declaration holds (Declared, Tool, Arg) and the services it binds to (Parts)
table.py      METHODS, the steps around every method, and `stack`: a method's steps composed once, in order
table_sessions.py, table_lifecycle.py, table_graph.py, table_coordination.py, table_usage.py  the declarations,
              by area
steps.py      the steps a declaration may name (coordination's, bound to the services), the composed handoff
build.py      the registry built from the table at start (a name declared twice fails there)
args.py       the MCP tools' arguments, each with the description an agent reads
openrpc.py    `rpc.discover`: the OpenRPC document of the whole table

The results the table declares are the client's typed results (client/results.py), one set for both sides.
Sits above bridge/ (it binds every room's methods) and below the transports (ws/, mcp/) and server/,
which read it: the MCP tools, the registry the gateway runs, the published docs/openrpc.json.
"""
