"""``pyspark.BarrierTaskContext`` inside a rank process, served by the Spark task that started it.

A training function written for spark-tensorflow-distributor runs inside its Spark barrier
task, and may call ``BarrierTaskContext.get().allGather(...)`` there. hvdflow runs it in a rank
process of its own (a clean interpreter it can kill as a whole), where pyspark alone would raise
``[NOT_IN_BARRIER_STAGE]``. So the task hands its rank a socket and a snapshot of its context:

- ``TaskContextServer`` (task side): answers the rank's ``barrier`` and ``allGather`` by making
  the same call on the task's real ``BarrierTaskContext``, one at a time, in the rank's order.
  Every task runs one rank, so every task makes the same calls in the same order, as barrier
  mode requires.
- ``install_in_rank`` (rank side): once the rank's code imports ``pyspark.taskcontext``, the
  context that ``BarrierTaskContext.get()`` and ``TaskContext.get()`` return is a
  ``BarrierTaskContext`` whose fixed answers (``partitionId``, ``stageId``, ``attemptNumber``,
  ``taskAttemptId``, ``getLocalProperty``, ``cpus``, ``resources``, ``getTaskInfos``) come from
  the snapshot, and whose ``barrier`` and ``allGather`` ask the task. A rank that never imports
  pyspark never loads it.

Where a task runs several ranks (one per GPU it holds) no context is served: their calls could
not be told apart in barrier mode, and Databricks' HorovodRunner (ranks under mpirun) has none
either. On the driver (``np < 0``, local mode) there is no barrier task, as in the originals.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

from hvdflow.infra.constants import HVDFLOW_TASK_CONTEXT, HVDFLOW_TASK_CONTEXT_FD
from hvdflow.infra.launcher import _wire

BARRIER, ALL_GATHER = "barrier", "allGather"
_TASKCONTEXT_MODULE = "pyspark.taskcontext"


def snapshot(ctx) -> dict[str, Any]:
    """What a ``BarrierTaskContext`` answers without asking anyone, as plain JSON values."""
    return {
        "stage_id": ctx.stageId(),
        "partition_id": ctx.partitionId(),
        "attempt_number": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(),
        "cpus": ctx.cpus(),
        "local_properties": dict(ctx._localProperties or {}),  # no public getter for all
        "resources": {name: list(info.addresses) for name, info in ctx.resources().items()},
        "task_addresses": [info.address for info in ctx.getTaskInfos()],
    }


class TaskContextServer:
    """The task's side: one socket pair per rank, answered by a thread until the rank ends."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._snapshot = json.dumps(snapshot(ctx))

    def start(self) -> tuple[dict[str, str], int, _Pair]:
        """The rank's variables, the fd to pass it, and the pair (``rank_started`` once the
        rank process exists, ``close`` when it has ended)."""
        task_end, rank_end = socket.socketpair()
        threading.Thread(
            target=self._serve, args=(task_end,), daemon=True, name="hvdflow-task-context"
        ).start()
        env = {
            HVDFLOW_TASK_CONTEXT_FD: str(rank_end.fileno()),
            HVDFLOW_TASK_CONTEXT: self._snapshot,
        }
        return env, rank_end.fileno(), _Pair(task_end, rank_end)

    def _serve(self, sock: socket.socket) -> None:
        conn = _wire.Connection(sock)
        while (request := conn.receive()) is not None:
            try:
                if request.get("op") == BARRIER:
                    self._ctx.barrier()
                    reply: dict[str, Any] = {"ok": True}
                elif request.get("op") == ALL_GATHER:
                    reply = {"messages": self._ctx.allGather(str(request.get("message", "")))}
                else:
                    reply = {"error": f"unknown request {request.get('op')!r}"}
            except Exception as e:  # noqa: BLE001 (the rank raises it where the user called)
                reply = {"error": f"{type(e).__name__}: {e}"}
            try:
                conn.send(reply)
            except OSError:
                return  # the rank is gone


class _Pair:
    """Both ends of a rank's socket pair: the task closes its copy of the rank's end once the
    rank has it, and its own end when the rank has ended."""

    def __init__(self, task_end: socket.socket, rank_end: socket.socket):
        self._task_end, self._rank_end = task_end, rank_end

    def rank_started(self) -> None:
        self._rank_end.close()

    def close(self) -> None:
        for end in (self._rank_end, self._task_end):
            try:
                end.close()
            except OSError:
                pass


def install_in_rank(patch_on_import) -> None:
    """In the rank: serve ``BarrierTaskContext.get()`` where the task passed a context.

    ``patch_on_import(module_name, patch)`` runs ``patch(module)`` when the module is first
    imported (``_patching.patch_on_import``), so pyspark is loaded only by code that uses it.
    """
    fd = os.environ.get(HVDFLOW_TASK_CONTEXT_FD)
    info = os.environ.get(HVDFLOW_TASK_CONTEXT)
    if not fd or not info:
        return
    link = _RankLink(int(fd))
    values = json.loads(info)

    def patch(taskcontext) -> None:
        context = _context_class(taskcontext)(values, link)
        # Where a Spark worker puts its barrier task's context, so both get()s find it.
        taskcontext.TaskContext._setTaskContext(context)
        taskcontext.BarrierTaskContext._taskContext = context

    patch_on_import(_TASKCONTEXT_MODULE, patch)


class _RankLink:
    """The rank's end: one request at a time, each answered before the next is sent."""

    def __init__(self, fd: int):
        self._conn = _wire.Connection(socket.socket(fileno=fd))
        self._lock = threading.Lock()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._conn.send(request)
            reply = self._conn.receive()
        if reply is None:
            raise RuntimeError(
                f"BarrierTaskContext.{request['op']}: the Spark task that runs this rank closed "
                "the connection (the run is stopping)"
            )
        if "error" in reply:
            raise RuntimeError(
                f"BarrierTaskContext.{request['op']} failed in the Spark task: {reply['error']}"
            )
        return reply


def _context_class(taskcontext):
    """A ``BarrierTaskContext`` subclass of the imported module's class, answering from
    ``values`` and asking the task through ``link``."""
    from pyspark.resource import ResourceInformation  # noqa: PLC0415, TID253 (pyspark is loaded)

    class RankBarrierTaskContext(taskcontext.BarrierTaskContext):
        def __init__(self, values: dict[str, Any], link: _RankLink):
            self._stageId = values["stage_id"]
            self._partitionId = values["partition_id"]
            self._attemptNumber = values["attempt_number"]
            self._taskAttemptId = values["task_attempt_id"]
            self._cpus = values["cpus"]
            self._localProperties = values["local_properties"]
            self._resources = {
                name: ResourceInformation(name, addresses)
                for name, addresses in values["resources"].items()
            }
            self._addresses = values["task_addresses"]
            self._link = link

        def barrier(self) -> None:
            self._link.ask({"op": BARRIER})

        def allGather(self, message: str = "") -> list[str]:
            if not isinstance(message, str):
                raise TypeError("Argument `message` must be of type `str`")
            return self._link.ask({"op": ALL_GATHER, "message": message})["messages"]

        def getTaskInfos(self) -> list:
            return [taskcontext.BarrierTaskInfo(address) for address in self._addresses]

    # TaskContext.__new__ hands out the singleton: build this one without it.
    def create(values, link):
        context = object.__new__(RankBarrierTaskContext)
        context.__init__(values, link)
        return context

    return create
