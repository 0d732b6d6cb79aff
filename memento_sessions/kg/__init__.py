"""The codebase knowledge graph in FalkorDB: namespace graphs, their indexes, and loading nodes and edges."""
