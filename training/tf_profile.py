"""Where a rank's training steps go, read from TensorFlow's profiler.

``TrainSpec(profile_dir=..., profile_batches=(start, stop))`` has every rank write an
``.xplane.pb`` under ``<profile_dir>/rank<N>/plugins/profile/<run>/``. Its host plane has a line
per thread:

- the Python thread, with one ``train_function`` event per step (Keras' compiled step);
- TensorFlow's executor threads (``tf_Compute``...), with an ``ExecutorState::Process`` event
  around every run of ops, the kernels nested inside;
- tf.data's threads, where ``IteratorGetNextOp::DoCompute`` is the step asking for its batch.

Horovod's allreduce is asynchronous: a step whose ops have all run and that has not returned is
waiting for its allreduces. So the steps' wall clock splits into ops running, the batch being
fetched, waiting inside the step, and the time between steps (Keras' loop, in Python).
"""

from __future__ import annotations

import glob
import os
from collections import defaultdict

STEP = "train_function"
RUNNING_OPS = "ExecutorState::Process"
FETCHING_INPUT = "IteratorGetNextOp::DoCompute"
HOST_PLANE = "/host:CPU"


def union_length(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """How long at least one span covers, within [start, end]."""
    covered, reach = 0.0, start
    for begin, finish in sorted(spans):
        begin, finish = max(begin, reach), min(finish, end)
        if finish > begin:
            covered += finish - begin
            reach = finish
    return covered


def newest_profile(folder: str) -> str:
    """The newest ``.xplane.pb`` under ``folder`` (a rank's profile folder)."""
    found = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.xplane.pb"))
    if not found:
        raise FileNotFoundError(
            f"no TensorFlow profile (.xplane.pb) under {folder}/plugins/profile"
        )
    return max(found, key=os.path.getmtime)


def host_events(path: str) -> dict[str, list[tuple[float, float]]]:
    """Event name -> (begin, end) spans in seconds, over every thread of the host plane."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415 (lazy: it loads TensorFlow)

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for plane in space.planes:
        if plane.name != HOST_PLANE:
            continue
        for line in plane.lines:
            origin_ps = line.timestamp_ns * 1000
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                begin = (origin_ps + event.offset_ps) / 1e12
                spans[name].append((begin, begin + event.duration_ps / 1e12))
    return dict(spans)


def step_breakdown(spans: dict[str, list[tuple[float, float]]], top: int = 5) -> dict:
    """Shares of the profiled steps' wall clock: ``ops`` running, ``input`` (itself an op: the two
    may overlap), ``waiting_in_step`` (allreduces not yet back) and ``between_steps``; with the
    ``top`` kernels by time, in milliseconds per step."""
    steps = sorted(spans.get(STEP, []))
    if not steps:
        return {}
    start, end = steps[0][0], steps[-1][1]
    wall = max(end - start, 1e-12)
    in_steps = union_length(steps, start, end)
    running = union_length(spans.get(RUNNING_OPS, []), start, end)
    fetching = union_length(spans.get(FETCHING_INPUT, []), start, end)
    # The batch is fetched by an op: busy is either, counted once.
    busy = union_length(spans.get(RUNNING_OPS, []) + spans.get(FETCHING_INPUT, []), start, end)
    kernels = {
        name: sum(min(e, end) - max(b, start) for b, e in found if e > start and b < end)
        for name, found in spans.items()
        # Kernels are ``<op name>:<op type>``; runtime scopes (``Class::Method``) are not.
        if ":" in name and "::" not in name and not name.startswith("EagerLocalExecute")
    }
    heaviest = sorted(kernels.items(), key=lambda item: -item[1])[:top]
    return {
        "steps": len(steps),
        "step_ms": 1000 * wall / len(steps),
        "ops": running / wall,
        "input": fetching / wall,
        "waiting_in_step": max(0.0, in_steps - busy) / wall,
        "between_steps": (wall - in_steps) / wall,
        "top_kernels_ms_per_step": {name: 1000 * t / len(steps) for name, t in heaviest},
    }
