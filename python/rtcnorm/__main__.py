"""``python -m rtcnorm``: see :mod:`rtcnorm.cli`."""

import sys

from .cli import main

sys.exit(main())
