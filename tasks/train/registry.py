"""The registry's aliases: ``candidate`` on the newest version, ``champion`` on the best one.

Every version a run registers enters a contest: ``assign_aliases`` tags it with its run's final
``val_accuracy`` (CONTENDER_TAG). ``candidate`` then goes to the newest contender and
``champion`` to the best one, where the current champion keeps its place unless a contender's
score is strictly higher (a first version becomes champion). Consumers load
``models:/<name>@champion``.

Two runs that finish together must not leave ``champion`` on the worse of them. MLflow has no
compare-and-set for aliases, and a lock around "read the champion, compare, set" would need a
second service that every training driver reaches and that grants a lock exactly once:
``hvdflow.infra.storage.locks`` holds only on one machine, and a lock object in S3 needs conditional
writes and an expiry (a holder paused beyond it races again). If that store were unreachable,
the run would have to fail after its training, or go on without the lock. So there is no lock:

- What each alias should be is a pure function of the contenders and the alias's holder
  (``newest``, ``best``), and the contenders only ever grow while runs register.
- Each call writes only what differs from what it read, then reads again, until a read shows
  nothing to change (at most ALIAS_ROUNDS rounds). A write the server refuses because another
  call inserted the same alias at the same moment is no write: the next read sees the other.

The last write of all is followed by its writer's own check, which finds nothing to change: at
that point the champion is at least as good as every contender tagged so far. A contender tagged
later is checked by its own call, against a champion that no longer moves, so it moves it only
if it is better. Whatever the interleaving, once every call has returned, ``champion`` is on the
best contender and ``candidate`` on the newest. The only service involved is the tracking server
the run already reports to; when it is unreachable the call fails, as registering would have.

A run that dies after tagging its version leaves a contender: the next call gives it the alias
it deserves. To keep a version out of the contest (say, after moving ``champion`` back from a
version found to be broken), delete its CONTENDER_TAG or the version: a contender that is better
than the champion takes the alias back at the next registration.
"""

from __future__ import annotations

import logging
import math

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from hvdflow.infra.tracking import CANDIDATE, CHAMPION

logger = logging.getLogger(__name__)

CHAMPION_METRIC = "val_accuracy"
# The version tag that enters a version in the contest; its value is the version's score (its
# run's final CHAMPION_METRIC, "-inf" without one), recorded once when it is registered.
CONTENDER_TAG = "hvdflow.contender_score"
# Read-compare-set rounds before a call gives up: each round that writes follows another call's
# write, so more rounds than concurrent registrations mean something else keeps moving them.
ALIAS_ROUNDS = 20
# MLflow's answer to a read of an alias that no version holds (its file and SQL stores say
# "Registered model alias <alias> not found."); every other error is a real failure.
_MISSING_ALIAS_CODES = frozenset({"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"})


def assign_aliases(name: str, version: str | None, client=None) -> list[str]:
    """Enter ``version`` of registered model ``name`` in the contest and settle the aliases;
    return the aliases it holds (``candidate``, and ``champion`` if it beat the champion).

    ``client``: an MlflowClient (default: one for the current tracking URI). Any MlflowException
    but "no version holds the alias" propagates.
    """
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
    """The version ``candidate`` belongs on: the highest-numbered contender, or its holder if
    that is newer still."""
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
    """Point ``alias`` at ``version``; losing a simultaneous write of the same alias to another
    call is no failure: the next round reads what that call wrote."""
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
    """The tracking server's SQL store refused a second row for the alias, inserted by another
    call between its check and its insert (sqlite, PostgreSQL and MySQL say it differently)."""
    message = str(getattr(error, "message", error))
    said = ("IntegrityError", "UniqueViolation", "UNIQUE constraint", "Duplicate entry")
    return error.error_code == "BAD_REQUEST" and any(words in message for words in said)


def _run_score(client, run_id: str) -> float:
    return _as_score(client.get_run(run_id).data.metrics.get(CHAMPION_METRIC, -math.inf))


def _as_score(value) -> float:
    """A comparable score: a missing or NaN metric ranks below every real one."""
    score = float(value)
    return -math.inf if math.isnan(score) else score
