"""`python -m memento_sessions.cli`: the console script without its wrapper."""

import sys

from memento_sessions.cli.commands import main

sys.exit(main())
