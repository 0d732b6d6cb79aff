#!/usr/bin/env python3
"""memento-sessions benchmark: every hot path beside the raw floor, measured in one run (see --help).

The code is the package scripts/bench/ (its __init__ says how to add a section); this file only runs it,
as `python -m bench` from scripts/ would.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]  # the bench package, then the project
    runpy.run_module("bench", run_name="__main__")
