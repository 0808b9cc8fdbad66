"""`python -m omniprobe_engine ...`: the offline runner (runner.py)."""

import sys

from omniprobe_engine.runner import main

sys.exit(main())
