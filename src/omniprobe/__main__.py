import sys

from omniprobe.cli import main

sys.exit(main())
