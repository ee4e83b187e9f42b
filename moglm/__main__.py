"""``python -m moglm``: the ``moglm`` command line."""

import sys

from .cli import main

sys.exit(main())
