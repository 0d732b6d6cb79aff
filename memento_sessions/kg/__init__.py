"""The codebase knowledge graph in FalkorDB: namespace graphs, their indexes, and loading nodes and edges.

graph.py (namespace graphs), loader.py (JSON Lines records, upsert), methods.py (`kg.upsert`),
commands.py (`memento-sessions kg load`), fixture.py (a generated graph for benchmarks).

May import the shared ground, embedded/ (to compact the embedded Redis after a load) and sessions/;
not checkpoints/, which builds on it.
"""
