"""``python -m moglm.cli``, the same as ``python -m moglm`` and the ``moglm`` script."""

import sys

from . import main

sys.exit(main())
