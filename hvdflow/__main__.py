"""``python -m hvdflow ...`` is the ``hvdflow`` command."""

import sys

from hvdflow.flows.cli import main

sys.exit(main())
