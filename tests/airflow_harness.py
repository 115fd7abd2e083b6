"""The Airflow the tests start: bench.airflow_local's, from the checkout's Airflow environment
(``.venv-airflow``, which ``make test-classic`` sets up with ``scripts/setup.sh airflow``)."""

from __future__ import annotations

from pathlib import Path

from hvdflow.bench.airflow_local import LocalAirflow
from tests.helpers import skip_here_fail_in_ci

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW_VENV = ROOT / ".venv-airflow"


def require_airflow() -> Path:
    """Airflow's command in its environment; skip (fail under CI=true) when it is missing."""
    airflow = AIRFLOW_VENV / "bin" / "airflow"
    if not airflow.exists():
        skip_here_fail_in_ci(
            f"no Airflow environment at {AIRFLOW_VENV}: run `scripts/setup.sh airflow`",
            "the Airflow tests",
        )
    return airflow


class Airflow(LocalAirflow):
    def __init__(self, home: Path, env: dict[str, str]):
        super().__init__(home, env, require_airflow())
