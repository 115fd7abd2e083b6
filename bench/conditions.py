"""One benchmark condition, measured in its own processes, the way a user would run it.

Conditions (``--conditions keras,keras1,ceiling2,hvd1,hvd2,tf2``):

- ``keras``: one plain Keras process using every core; ``kerasN``: limited to N threads.
- ``ceilingN``: N plain Keras processes of ``threads_per_rank`` threads at once: the most N ranks
  can get from this machine when nothing is exchanged.
- ``hvdN`` (also ``N`` or ``np=N``): HorovodRunner with N ranks of ``threads_per_rank`` threads.
- ``tfN``: the same launcher with the tf_collective engine (MultiWorkerMirroredStrategy).

Every condition trains the same model on the same data with the same per-process batch. The first
epoch is the warm-up, the others steady state; launch overhead is the wall clock minus training.
Time to a target accuracy is when the driver's log showed the first evaluation that reached it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from hvdflow.infra import LaunchOptions, LogLine, constants
from hvdflow.training.epoch_log import epoch_done_times, epoch_times_from_log, evaluations
from hvdflow.training.optimizers import rank_batch_size
from hvdflow.training.result import RankResult
from hvdflow.training.spec import TrainSpec

KERAS, CEILING, HOROVOD, TF = "keras", "ceiling", "hvd", "tf"
ENGINE_OF = {HOROVOD: constants.HOROVOD, TF: constants.TF_COLLECTIVE}
_CONDITION = re.compile(r"^(keras|ceiling|hvd|tf|np=)?(\d*)$")


@dataclass(frozen=True)
class Condition:
    name: str  # as the tables show it: keras, keras1, ceiling2, hvd2, tf2
    kind: str  # keras, ceiling, hvd or tf
    n: int  # threads (kerasN), processes (ceilingN) or ranks (hvdN, tfN); 0 for keras

    @property
    def processes(self) -> int:
        return 1 if self.kind == KERAS else self.n

    @property
    def ranks(self) -> int:
        """Ranks of an engine condition; 0 for the plain Keras ones."""
        return self.n if self.kind in (HOROVOD, TF) else 0


def dataset_readers(conditions) -> int:
    """Shards the study's dataset needs: the most ranks of an engine condition, at least one."""
    return max([1, *(parse_condition(c).ranks for c in conditions)])


def parse_condition(text: str) -> Condition:
    """``keras``, ``keras1``, ``ceiling2``, ``hvd2`` (or ``2``, ``np=2``), ``tf2``."""
    raw = str(text).strip().lower()
    match = _CONDITION.match(raw)
    kind = (match.group(1) or "") if match else None
    digits = match.group(2) if match else ""
    if match is None or (kind != KERAS and (not digits or int(digits) < 1)):
        raise ValueError(
            f"condition {text!r}: expected keras, kerasN (N threads), ceilingN (N Keras processes "
            "at once), hvdN or N (HorovodRunner, N ranks) or tfN (the tf_collective engine)"
        )
    if kind == KERAS:
        n = int(digits) if digits else 0
        return Condition(f"keras{digits}" if n else KERAS, KERAS, n)
    kind = HOROVOD if kind in ("", "np=", HOROVOD) else kind
    return Condition(f"{kind}{int(digits)}", kind, int(digits))


@dataclass(frozen=True)
class Measurement:
    condition: str
    np: int  # ranks of an engine condition, 0 for the Keras ones
    repetition: int
    epoch_times: list[float]  # callback method, one process (the slowest of a ceiling)
    epoch_times_log: list[float]  # the paper's log method
    wall_clock_s: float  # launch included
    images: int  # images trained over all epochs, by every process together
    train_seconds: float = 0.0  # model.fit, in the (slowest) process
    processes: int = 1
    threads: int = 0  # per process; 0: every core (shared among the processes)
    kind: str = HOROVOD
    extra: dict = field(default_factory=dict)
    val_accuracy: list[float] = field(default_factory=list)  # after each epoch
    # Seconds from the launch until the driver's log showed each epoch done; empty without lines.
    epoch_done_s: list[float] = field(default_factory=list)
    # Evaluations every ``eval_every``, from the driver's log: [seconds since the launch, images
    # trained, val_accuracy, seconds the evaluation took].
    evaluations: list[list[float]] = field(default_factory=list)

    @property
    def final_val_accuracy(self) -> float | None:
        return self.val_accuracy[-1] if self.val_accuracy else None

    def seconds_to(self, target: float) -> float | None:
        """Wall clock from the launch to the first evaluation that reached ``target`` (MLPerf's
        time to train); None if none did. Without evaluations every few steps, the end of the
        first epoch that reached it, as the driver's log showed it, else launch plus epochs."""
        if self.evaluations:
            return next((e[0] for e in self.evaluations if e[2] >= target), None)
        for epoch, accuracy in enumerate(self.val_accuracy):
            if accuracy >= target:
                if epoch < len(self.epoch_done_s):
                    return self.epoch_done_s[epoch]
                return self.launch_s + sum(self.epoch_times[: epoch + 1])
        return None

    def images_to(self, target: float) -> int | None:
        """Images trained up to the first evaluation that reached ``target``; or None."""
        return next((int(e[1]) for e in self.evaluations if e[2] >= target), None)

    @property
    def evaluation_share(self) -> float | None:
        """The share of the training's time (model.fit) spent on evaluations every few steps."""
        if not self.evaluations or not self.train_seconds:
            return None
        return sum(e[3] for e in self.evaluations) / self.train_seconds

    @property
    def images_per_epoch(self) -> float:
        return self.images / max(1, len(self.epoch_times))

    @property
    def warmup_s(self) -> float:
        return self.epoch_times[0]

    @property
    def steady_epoch_times(self) -> list[float]:
        """Every epoch but the first; the first alone when there is only one."""
        return self.epoch_times[1:] or self.epoch_times[:1]

    @property
    def steady_images_per_s(self) -> float:
        steady = self.steady_epoch_times
        return self.images_per_epoch / (sum(steady) / len(steady))

    @property
    def launch_s(self) -> float:
        """Wall clock not spent in model.fit: starting processes, Spark, rendezvous, data."""
        return max(0.0, self.wall_clock_s - self.train_seconds)

    @property
    def images_per_s(self) -> float:
        """The paper's measure: images trained / wall clock, launch included."""
        return self.images / self.wall_clock_s

    @property
    def images_per_s_epoch(self) -> list[float]:
        return [self.images_per_epoch / t for t in self.epoch_times]


def trainer_for(name: str):
    """The rank function of a trainer: ``classifier`` (images) or ``gcn`` (graphs)."""
    if name == "gcn":
        from hvdflow.training.gcn import train_gcn  # noqa: PLC0415 (lazy: it loads numpy)

        return train_gcn
    if name == "classifier":
        from hvdflow.training.trainer import train_classifier  # noqa: PLC0415 (lazy: it loads numpy)

        return train_classifier
    raise ValueError(f"trainer {name!r} is unknown: expected 'classifier' or 'gcn'")


def measure(
    condition: str,
    repetition: int,
    train_kwargs: dict,
    trainer: str = "classifier",
    options: LaunchOptions | None = None,
    threads_per_rank: int = 1,
) -> Measurement:
    """One run of ``condition``; ``options``: the launcher's, with the condition's engine."""
    from hvdflow.infra import HorovodRunner  # noqa: PLC0415 (lazy: a tenth of a second of imports)

    c = parse_condition(condition)
    kwargs = seeded_for(trainer, train_kwargs, repetition)
    lines: list[LogLine] = []
    launched = time.time()  # the clock LogLine.time reads
    started = time.perf_counter()
    if c.kind == KERAS:
        results = [
            _run_baseline(trainer, with_options(trainer, kwargs, threads=c.n or None), lines)
        ]
    elif c.kind == CEILING:
        one = with_options(trainer, kwargs, threads=threads_per_rank)
        if trainer == "classifier" and one["spec"].global_batch:
            # Each process does what one of N ranks does: its share of the global batch.
            spec = one["spec"]
            share = rank_batch_size(spec.batch_size, c.n, global_batch=True)
            one = {"spec": spec.replace(batch_size=share, global_batch=False)}
        results = _run_baselines(trainer, one, c.n, lines)
    else:
        if trainer == "classifier":
            kwargs = with_options(
                trainer, kwargs, engine=ENGINE_OF[c.kind], threads=threads_per_rank
            )
        elif c.kind != HOROVOD:
            raise ValueError(f"condition {c.name}: the {trainer} trainer runs on Horovod only")
        options = dataclasses.replace(
            options or LaunchOptions(), on_log_line=lines.append, engine=ENGINE_OF[c.kind]
        )
        runner = HorovodRunner(np=c.n, options=options)
        results = [runner.run(trainer_for(trainer), **kwargs)]
    wall = time.perf_counter() - started
    slowest = max(results, key=lambda r: sum(r.epoch_times))
    epochs = len(slowest.epoch_times)
    return Measurement(
        condition=c.name,
        np=c.ranks,
        repetition=repetition,
        epoch_times=concurrent_epoch_times([r.epoch_times for r in results]),
        epoch_times_log=epoch_times_from_log(lines) if len(results) == 1 else [],
        wall_clock_s=wall,
        images=sum(r.images_per_epoch for r in results) * epochs,
        train_seconds=max(r.train_seconds for r in results),
        processes=c.processes,
        # The GCN shares each host's cores among its ranks itself: no fixed budget (0).
        threads=c.n if c.kind == KERAS else (threads_per_rank if trainer == "classifier" else 0),
        kind=c.kind,
        # A ceiling's processes each train the whole model alike: the first one's accuracy.
        val_accuracy=[float(a) for a in results[0].history.get("val_accuracy", ())],
        epoch_done_s=seconds_since(launched, epoch_done_times(lines)),
        evaluations=[
            [round(at - launched, 3), images, accuracy, took]
            for at, images, accuracy, took in evaluations(lines)
        ],
    )


def seconds_since(launched: float, done: dict[int, float]) -> list[float]:
    """Each epoch's done time as seconds since the launch, up to the first missing epoch."""
    seconds = []
    for epoch in range(1, len(done) + 1):
        if epoch not in done:
            break
        seconds.append(round(done[epoch] - launched, 3))
    return seconds


def with_options(trainer: str, kwargs: dict, **options) -> dict:
    """``kwargs`` of ``trainer`` with ``options``: into the classifier's ``TrainSpec`` (or its
    ``to_dict()``); the GCN knows only ``use_horovod``."""
    if trainer == "classifier":
        spec = kwargs["spec"]
        spec = spec if isinstance(spec, TrainSpec) else TrainSpec.from_dict(spec)
        return {"spec": spec.replace(**options)}
    return {**kwargs, **{k: v for k, v in options.items() if k == "use_horovod"}}


def seeded_for(trainer: str, kwargs: dict, repetition: int) -> dict:
    """``kwargs`` for repetition ``repetition`` (from 0): each its own seed, as MLPerf Training
    asks, or every repetition would sample the machine, not the training."""
    if trainer == "classifier":
        spec = with_options(trainer, kwargs)["spec"]
        return {"spec": spec.replace(seed=spec.seed + repetition)}
    return {**kwargs, "seed": kwargs.get("seed", 0) + repetition}


def to_json(trainer: str, kwargs: dict) -> str:
    """``kwargs`` as the baseline process reads them back (``with_options`` takes either)."""
    if trainer == "classifier":
        return json.dumps({"spec": with_options(trainer, kwargs)["spec"].to_dict()})
    return json.dumps(kwargs)


def concurrent_epoch_times(per_process: list[list[float]]) -> list[float]:
    """Epoch times of processes that ran at once: each epoch lasts as long as its slowest."""
    return [max(times) for times in zip(*per_process, strict=True)]


def _run_baselines(
    trainer: str, kwargs: dict, count: int, lines: list[LogLine]
) -> list[RankResult]:
    """``count`` baseline processes at once (the machine ceiling)."""
    results: list[RankResult | None] = [None] * count
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results[i] = _run_baseline(trainer, kwargs, lines if i == 0 else [])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _run_baseline(trainer: str, train_kwargs: dict, lines: list[LogLine]) -> RankResult:
    process = subprocess.Popen(
        [sys.executable, "-m", "hvdflow.bench.baseline", trainer, to_json(trainer, train_kwargs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    result, tail = None, []
    for raw in process.stdout:
        text = raw.rstrip("\n")
        tail = (tail + [text])[-30:]
        if text.startswith("HVDFLOW_RESULT "):
            result = RankResult.from_dict(json.loads(text.removeprefix("HVDFLOW_RESULT ")))
        else:
            lines.append(LogLine(time.time(), 0, "stdout", text))
    if process.wait() != 0 or result is None:
        raise RuntimeError(
            f"the Keras baseline failed (exit code {process.returncode}). Last lines:\n"
            + "\n".join(tail)
        )
    return result
