#!/usr/bin/env python3
"""Write docs/openrpc.json: the OpenRPC document of every declared method (the one `rpc.discover` answers)."""

from __future__ import annotations

import json
from pathlib import Path

from memento_sessions.api.table import openrpc_document

if __name__ == "__main__":
    path = Path(__file__).resolve().parent.parent / "docs" / "openrpc.json"
    path.write_text(json.dumps(openrpc_document(), indent=1) + "\n")
    print(f"wrote {path}")
