"""Where hvdflow keeps what outlives a run on this machine: ``$HVDFLOW_HOME`` (``~/.hvdflow``).

The local services' data and state, the CLI's logs and every HorovodRunner run's log live under
it, never in /tmp, which nothing cleans and a reboot empties.
"""

from __future__ import annotations

import os
from pathlib import Path

from hvdflow.infra.constants import HVDFLOW_HOME


def hvdflow_home() -> Path:
    return Path(os.environ.get(HVDFLOW_HOME) or Path.home() / ".hvdflow")
