"""The registry's aliases: ``candidate`` on the newest version, ``champion`` on the best one.

Every version a run registers enters a contest: ``assign_aliases`` tags it with its run's final
``val_accuracy`` (CONTENDER_TAG). ``candidate`` goes to the newest contender, ``champion`` to the
best, the current champion keeping its place unless a contender scores strictly higher.

Two runs that finish together must not leave ``champion`` on the worse of them. MLflow has no
compare-and-set for aliases, and a lock would need a second service every driver reaches
(``hvdflow.infra.storage.locks`` holds on one machine only). So there is no lock:

- What each alias should be is a pure function of the contenders and the alias's holder
  (``newest``, ``best``), and the contenders only grow while runs register.
- Each call writes only what differs from what it read, then reads again, until a read shows
  nothing to change (at most ALIAS_ROUNDS). A write refused because another call inserted the
  same alias at that moment is no write: the next read sees the other.

The last write of all is followed by its writer's own check, which finds nothing to change, so
once every call has returned, ``champion`` is on the best contender and ``candidate`` on the
newest, whatever the interleaving. A run that dies after tagging its version leaves a contender
the next call settles. To keep a version out of the contest, delete its CONTENDER_TAG.
"""

from __future__ import annotations

import logging
import math

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from hvdflow.infra.tracking import CANDIDATE, CHAMPION

logger = logging.getLogger(__name__)

CHAMPION_METRIC = "val_accuracy"
# Its value: the version's score (its run's final CHAMPION_METRIC, "-inf" without one).
CONTENDER_TAG = "hvdflow.contender_score"
# Each round that writes follows another call's write: more rounds than concurrent
# registrations mean something else keeps moving the aliases.
ALIAS_ROUNDS = 20
# MLflow's answer to a read of an alias no version holds; every other error is a failure.
_MISSING_ALIAS_CODES = frozenset({"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"})


def assign_aliases(name: str, version: str | None, client=None) -> list[str]:
    """Enter ``version`` of registered model ``name`` in the contest and settle the aliases;
    return the aliases it holds. ``client``: an MlflowClient (default: the current tracking
    URI's). Any MlflowException but "no version holds the alias" propagates."""
    if version is None:
        return []
    if client is None:
        client = MlflowClient()
    _enter_contest(client, name, version)
    for _ in range(ALIAS_ROUNDS):
        wanted = _wanted_holders(client, name)
        moves = {alias: v for alias, (v, held) in wanted.items() if v is not None and v != held}
        if not moves:
            return [alias for alias, (v, _held) in wanted.items() if v == str(version)]
        for alias, target in moves.items():
            _move(client, name, alias, target)
    raise RuntimeError(
        f"the aliases of registered model {name!r} did not settle in {ALIAS_ROUNDS} rounds "
        "(ALIAS_ROUNDS in hvdflow.tasks.train.registry): something other than hvdflow keeps moving "
        f"{CANDIDATE!r} or {CHAMPION!r}; stop it, then register again"
    )


def newest(contenders: dict[str, float], holder: str | None) -> str | None:
    """The version ``candidate`` belongs on: the highest-numbered of contenders and holder."""
    versions = [*contenders, *([holder] if holder else [])]
    return max(versions, key=int) if versions else None


def best(contenders: dict[str, float], holder: tuple[str, float] | None) -> str | None:
    """The version ``champion`` belongs on: the highest score among the contenders and the
    ``(version, score)`` holding it now; on a tie the holder stays, else the oldest wins."""
    scores = dict(contenders)
    if holder is not None:
        scores[holder[0]] = holder[1]
    if not scores:
        return None
    top = max(scores.values())
    if holder is not None and holder[1] == top:
        return holder[0]
    return min((v for v, score in scores.items() if score == top), key=int)


def _wanted_holders(client, name: str) -> dict[str, tuple[str | None, str | None]]:
    """alias -> (the version it belongs on, the version holding it now), read now."""
    candidate = _holder(client, name, CANDIDATE)
    champion = _holder(client, name, CHAMPION)
    contenders = _contenders(client, name)
    incumbent = None
    if champion is not None:
        score = contenders.get(champion.version)
        if score is None:  # a version from before the contest, or one set by hand
            score = _run_score(client, champion.run_id)
        incumbent = (champion.version, score)
    held_candidate = candidate.version if candidate else None
    return {
        CANDIDATE: (newest(contenders, held_candidate), held_candidate),
        CHAMPION: (best(contenders, incumbent), champion.version if champion else None),
    }


def _move(client, name: str, alias: str, version: str) -> None:
    """Point ``alias`` at ``version``; losing a simultaneous write to another call is no failure."""
    logger.info("moving alias %s of %s to version %s", alias, name, version)
    try:
        client.set_registered_model_alias(name, alias, version)
    except MlflowException as e:
        if not _is_simultaneous_write(e):
            raise
        logger.info(
            "alias %s of %s was set by another run meanwhile: reading it again", alias, name
        )


def _enter_contest(client, name: str, version: str) -> None:
    run_id = client.get_model_version(name, version).run_id
    score = _run_score(client, run_id) if run_id else -math.inf
    client.set_model_version_tag(name, version, CONTENDER_TAG, repr(score))


def _contenders(client, name: str) -> dict[str, float]:
    """version -> score of every version of ``name`` that carries CONTENDER_TAG."""
    contenders, token = {}, None
    while True:
        page = client.search_model_versions(f"name = '{name}'", page_token=token)
        for found in page:
            recorded = (found.tags or {}).get(CONTENDER_TAG)
            if recorded is not None:
                contenders[str(found.version)] = _as_score(recorded)
        token = page.token
        if not token:
            return contenders


def _holder(client, name: str, alias: str):
    """The model version holding ``alias``, or None when no version does."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if _is_missing_alias(e, alias):
            return None
        raise


def _is_missing_alias(error, alias: str) -> bool:
    message = str(getattr(error, "message", error)).lower()
    return error.error_code in _MISSING_ALIAS_CODES and f"alias {alias} not found" in message


def _is_simultaneous_write(error) -> bool:
    """The SQL store refused a second row for the alias, inserted by another call between its
    check and its insert (sqlite, PostgreSQL and MySQL say it differently)."""
    message = str(getattr(error, "message", error))
    said = ("IntegrityError", "UniqueViolation", "UNIQUE constraint", "Duplicate entry")
    return error.error_code == "BAD_REQUEST" and any(words in message for words in said)


def _run_score(client, run_id: str) -> float:
    return _as_score(client.get_run(run_id).data.metrics.get(CHAMPION_METRIC, -math.inf))


def _as_score(value) -> float:
    """A comparable score: a missing or NaN metric ranks below every real one."""
    score = float(value)
    return -math.inf if math.isnan(score) else score
