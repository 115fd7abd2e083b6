"""The soak's loop: start the stack once, run the plan through the deployment, strike each
run's fault at its moment, and check after every run and whenever nothing is in flight."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.cluster.fixtures import BAD
from tests.soak import checks, faults
from tests.soak import stack as s
from tests.soak.faces import EPOCH_LINE, SCORE_DAG, AirflowFace, PrefectFace, log_line
from tests.soak.plan import AIRFLOW, BEFORE, EPOCH, FAULT_KINDS, PREFECT, PlannedRun

RUN_TIMEOUT_S = 900.0  # a run not final by then is wedged: cancelled, and counted
# What the training step logs when an attempt failed and the next one resumes.
RETRY_LINE = "running it again from the last checkpoint"
TRIGGER_TIMEOUT_S = 600.0


@dataclass
class RunRecord:
    planned: PlannedRun
    flow_run_id: str = ""
    strike: dict = field(default_factory=dict)
    outcome: dict = field(default_factory=dict)
    mlflow: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    recovered_s: float | None = None


@dataclass
class IdleCheck:
    after_run: int
    problems: list[str]
    leftovers: list[str]
    figures: dict


def run_params(
    planned: PlannedRun, prepared: dict, epochs: int, spark_master: str | None = None
) -> dict:
    """``spark_master``: a Spark Connect URL for a run planned through it; else the worker's
    own (its driver on the cluster's master)."""
    launcher = {"np": prepared.get("np", 2), "heartbeat_timeout_s": 20.0}
    if "min_np" in prepared:
        launcher |= {"min_np": prepared["min_np"], "elastic_wait_s": 8.0}
    if spark_master:
        launcher["spark_master"] = spark_master
    return {
        "data": {"input": s.RAW, "input_format": "folders", "output": s.DATASETS},
        # A seed of its own: runs of one seed train the same model, whose accuracy never beats
        # the champion's, so an Airflow run's `register` was skipped and the scoring that
        # follows a new champion was never checked.
        "training": {
            "epochs": epochs,
            "batch_size": 16,
            "framework": planned.framework,
            "seed": planned.index,
        },
        "launcher": launcher,
        "tracking": {"registered_model_name": s.MODEL, "experiment": s.MODEL},
    }


class WorkerLog(threading.Thread):
    """Every line of the runs' logs (each Prefect worker the soak started, each attempt of
    Airflow's train task), with when it was read: read continuously, so that a fault is timed
    by the line that triggers it."""

    def __init__(self, stack, faces):
        super().__init__(daemon=True)
        self.stack, self.faces = stack, faces
        self.lines: list[tuple[float, str]] = []
        self._offsets: dict[Path, int] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.05):
            for path in [p for face in self.faces for p in face.log_files(self.stack)]:
                with path.open("rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
                cut = data.rfind(b"\n") + 1
                self._offsets[path] = self._offsets.get(path, 0) + cut
                now = time.time()
                text = data[:cut].decode(errors="replace")
                self.lines += [(now, log_line(path, ln)) for ln in text.splitlines()]

    def stop(self) -> None:
        self._stop.set()


class Soak:
    def __init__(
        self,
        stack,
        plan: list[PlannedRun],
        epochs: int,
        say=print,
        score=True,
        score_in_airflow=False,
    ):
        self.stack, self.plan, self.epochs, self.say = stack, plan, epochs, say
        self.score = score  # after the plan: one scoring run with the champion it left
        self.score_in_airflow = score_in_airflow  # and one through Airflow's scoring DAG
        self.airflow_scoring: dict = {}
        self.scoring: dict = {}
        self.records: list[RunRecord] = []
        self.idle: list[IdleCheck] = []
        self.ledger = checks.Ledger()
        self.faces = {PREFECT: PrefectFace(), AIRFLOW: AirflowFace(stack)}
        self.scored_by_airflow: set[str] = set()  # its scoring DAG runs seen so far
        self.log = WorkerLog(stack, list(self.faces.values()))
        self.log.start()
        self.damage: list[tuple[int, str, str]] = []  # (run index, kind, what)
        self.harness_errors: list[str] = []
        self.started = time.time()

    # --- set-up ---------------------------------------------------------------------------
    def set_up(self) -> None:
        stack = self.stack
        stack.start_services()
        store = stack.store()
        store.ensure_bucket()
        good = self.good = stack.upload_digits()
        for name, data in BAD.items():
            store.put_bytes(data, s.RAW + name, "application/octet-stream")
        stack.deploy(self.epochs)
        _spark_slots(len(stack.cluster.hosts + stack.cluster.spare_hosts))
        stack.start_worker()
        self.say(f"soak: {good} digits and {len(BAD)} bad files in {s.RAW}; worker started")
        if any(planned.face == AIRFLOW for planned in self.plan):
            stack.start_airflow_soon()
        self.baseline = {
            "hosts": checks.host_tmp(stack),
            "root_tmp": checks.root_tmp_entries(exclude=stack.own_tmp()),
        }

    # --- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        in_flight: list[RunRecord] = []
        for planned in self.plan:
            if not planned.overlap:
                self.settle(in_flight)
            planned = self.spark_for(planned)
            record = RunRecord(planned)
            self.records.append(record)
            try:
                prepared = faults.prepare(self.stack, planned.fault, planned.index)
            except Exception as e:  # the soak's own failure: noted, and the run goes ahead
                prepared = {}
                self.harness_errors.append(f"run {planned.index}: could not prepare: {e!r}")
            when = FAULT_KINDS.get(planned.fault)
            if when == BEFORE:
                record.strike = self.strike(planned)
            face = self.faces[planned.face]
            record.flow_run_id = _retrying(
                lambda face=face, prepared=prepared, planned=planned: face.submit(
                    run_params(planned, prepared, self.epochs, self.spark_master(planned))
                )
            )
            through = " through Spark Connect" if planned.connect else ""
            self.say(
                f"run {planned.index} ({face.name}{through}): {record.flow_run_id} "
                f"{planned.fault or 'no fault'}{' (overlapping)' if planned.overlap else ''}"
            )
            in_flight.append(record)
            if when == EPOCH:
                self.strike_in_run(record)
        self.settle(in_flight)
        # Its application holds every core: the scoring runs' drivers would get none.
        self.stack.stop_connect()
        if self.score:
            self.score_champion()
        if self.score_in_airflow and self.stack.airflow is not None:
            self.score_champion_in_airflow()

    def spark_master(self, planned: PlannedRun) -> str | None:
        return self.stack.connect.url if planned.connect else None

    def spark_for(self, planned: PlannedRun) -> PlannedRun:
        """The Spark Connect server running for a run through it, and for no other run (its
        application holds every core); the run as it goes: one planned through a server that
        would not start goes through a driver of its own, said as a harness error."""
        stack = self.stack
        if stack.connect is not None and not (planned.connect and stack.connect_alive()):
            if planned.connect:  # died since the run before: its log says why
                self.harness_errors.append(f"run {planned.index}: the Connect server had died")
            stack.stop_connect()
        if planned.connect and stack.connect is None:
            try:
                url = stack.start_connect()
            except Exception as e:  # the soak's own failure: noted, and the run goes ahead
                self.harness_errors.append(f"run {planned.index}: no Connect server: {e!r}")
                return replace(planned, connect=False)
            self.say(f"soak: Spark Connect server at {url} for the runs through it")
        return planned

    def score_champion(self) -> None:
        """One scoring run through its deployment, on the raw images the pipeline trained on,
        with the champion the runs left: completed, every good image scored once, the bad ones
        quarantined, one MLflow scoring run for it."""
        from prefect.deployments import run_deployment

        params = {"model": {"name": s.MODEL}, "data": {"input": s.RAW, "output": s.SCORES}}
        run = _retrying(
            lambda: run_deployment(s.SCORE_DEPLOYMENT, parameters={"params": params}, timeout=0)
        )
        flow_run_id = str(run.id)
        self.say(f"scoring: {flow_run_id}")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        prefect = self.faces[PREFECT]
        while prefect.state(flow_run_id) != "final" and time.monotonic() < deadline:
            time.sleep(1)
        outcome = _retrying(lambda: prefect.outcome(flow_run_id))
        self.scoring = {"flow_run_id": flow_run_id, "state": outcome["state"]}
        self.scoring |= _retrying(lambda: checks.scoring_of(self.stack.store(), self.good))
        if outcome["state"] != "COMPLETED":
            self.scoring["problems"].append(f"{outcome['state']}: {outcome['reason'][:300]}")
        self.say(f"scoring: {outcome['state']}, {self.scoring}")
        self.check_idle()

    def score_champion_in_airflow(self) -> None:
        """Airflow's scoring DAG triggered by hand (an empty version: the champion now), as a
        person does from its form: it must succeed, scoring every good image."""
        airflow = self.stack.airflow
        run_id = _retrying(lambda: airflow.trigger(SCORE_DAG, {"version": None}))
        self.say(f"Airflow scoring: {SCORE_DAG}/{run_id}")
        run = airflow.wait_for_run(SCORE_DAG, run_id, RUN_TIMEOUT_S)
        self.scored_by_airflow.add(run_id)
        scored = airflow.xcom(SCORE_DAG, run_id, "score") if run["state"] == "success" else {}
        problems = []
        if run["state"] != "success":
            problems.append(f"{run['state']}: {airflow.task_states(SCORE_DAG, run_id)}")
        elif scored.get("scored") != self.good:
            problems.append(f"scored {scored.get('scored')} of {self.good} good images")
        self.airflow_scoring = {
            "run_id": f"{SCORE_DAG}/{run_id}",
            "state": run["state"],
            "scored": scored.get("scored"),
            "model_version": scored.get("model_version"),
            "problems": problems,
        }
        self.say(f"Airflow scoring: {self.airflow_scoring}")
        self.check_idle()

    def strike(self, planned: PlannedRun) -> dict:
        began = time.time()
        kind = planned.fault
        strike_fn = faults.STRIKES[kind]
        try:
            if kind == "broken_images":
                done = strike_fn(self.stack, planned.detail, planned.index)
            else:
                done = strike_fn(self.stack, planned.detail)
        except Exception as e:  # the soak's own failure: noted, and the soak goes on
            done = {"struck": f"could not strike: {type(e).__name__}: {e}"}
            self.harness_errors.append(f"run {planned.index} {kind}: {done['struck']}")
            self.say(f"  fault {kind}: {done['struck']}")
            return done
        if done["struck"].startswith(faults.NOT_STRUCK):  # found nothing to strike: not injected
            self.say(f"  fault {kind}: {done['struck']}")
            return done
        if kind == "weights_altered" and "uri" in done:
            self.ledger.damaged_weights.add(done["uri"])
            self.damage.append((planned.index, kind, done["uri"]))
        if kind == "row_group_corrupt" and "attempt" in done:
            self.ledger.damaged_attempts.add(done["attempt"])
            self.damage.append((planned.index, kind, done["attempt"]))
        done |= {"began": began, "ended": time.time()}
        self.say(f"  fault {kind}: {done['struck']}")
        return done

    def strike_in_run(self, record: RunRecord) -> None:
        planned = record.planned
        if not self.wait_running(record):
            record.strike = {"struck": f"{faults.NOT_STRUCK}the run ended before it ran"}
            self.say(f"  fault {planned.fault}: {record.strike['struck']}")
            return
        seen = len(self.log.lines)  # what came before this run began
        trigger = re.compile(rf"<log>:Epoch {planned.epoch}/{self.epochs}\s*$")
        pause = planned.delay_s
        deadline = time.monotonic() + TRIGGER_TIMEOUT_S
        while time.monotonic() < deadline:
            lines = self.log.lines[seen:]
            seen += len(lines)
            if any(trigger.search(line) for _, line in lines):
                time.sleep(pause)
                record.strike = self.strike(planned)
                return
            if self.final(record):
                record.strike = {"struck": f"{faults.NOT_STRUCK}the run ended before its trigger"}
                self.say(f"  fault {planned.fault}: {record.strike['struck']}")
                return
            time.sleep(0.05)
        record.strike = {"struck": f"{faults.NOT_STRUCK}no trigger within {TRIGGER_TIMEOUT_S:g} s"}

    def recovery(self, record: RunRecord, ended: float) -> float | None:
        """Seconds from the fault's start until training went on: the first epoch begun after
        the next attempt was announced, else after the fault ended; else the run's end."""
        began, over = record.strike.get("began"), record.strike.get("ended")
        if began is None or FAULT_KINDS[record.planned.fault] == BEFORE:
            return None
        after = [(t, ln) for t, ln in self.log.lines if began <= t <= ended]
        retry = next((t for t, ln in after if RETRY_LINE in ln), None)
        since = retry if retry is not None else over
        resumed = next((t for t, ln in after if t >= since and EPOCH_LINE.search(ln)), None)
        return (resumed if resumed is not None else ended) - began

    # --- after runs -----------------------------------------------------------------------
    def face(self, record: RunRecord):
        return self.faces[record.planned.face]

    def wait_running(self, record: RunRecord) -> bool:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            state = self.face(record).state(record.flow_run_id)
            if state in ("running", "final"):
                return state == "running"
            time.sleep(0.5)
        return False

    def final(self, record: RunRecord) -> bool:
        return self.face(record).state(record.flow_run_id) == "final"

    def settle(self, in_flight: list[RunRecord]) -> None:
        if not in_flight:
            return
        for record in in_flight:
            self.finish(record)
        in_flight.clear()
        self.check_idle()

    def finish(self, record: RunRecord) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        face = self.face(record)
        while not self.final(record):
            if time.monotonic() > deadline:
                record.problems.append(f"wedged: not final within {RUN_TIMEOUT_S:g} s")
                face.cancel(record.flow_run_id)
                break
            time.sleep(1)
        outcome = _retrying(lambda: face.outcome(record.flow_run_id))
        record.outcome = outcome
        ended = outcome.pop("ended_at")
        if ended is not None and outcome.get("seconds") is not None:
            outcome["window"] = [ended - outcome["seconds"], ended]  # epoch seconds
        record.recovered_s = self.recovery(record, ended or time.time())
        completed = outcome["state"] == "COMPLETED"
        if not completed and not outcome["reason"]:
            record.problems.append(f"{outcome['state']} without a reason")
        record.mlflow = _retrying(
            lambda: checks.mlflow_of(record.flow_run_id, self.epochs, completed)
        )
        record.problems += record.mlflow.pop("problems")
        self.say(
            f"run {record.planned.index}: {outcome['state']}"
            + (f" ({outcome['reason'][:200]})" if outcome["reason"] and not completed else "")
            + f", {outcome['epochs_recomputed']} epochs recomputed"
            + (f"; problems: {record.problems}" if record.problems else "")
        )
        if face.name == AIRFLOW and outcome.get("tasks", {}).get("register") == "success":
            self.check_scoring_after(record)

    def check_scoring_after(self, record: RunRecord) -> None:
        """The scoring DAG run that the champion an Airflow run made started (by the asset
        event), once final: it must have succeeded."""
        airflow = self.stack.airflow
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            runs = _retrying(lambda: airflow.runs(SCORE_DAG))
            new = [r for r in runs if r["dag_run_id"] not in self.scored_by_airflow]
            if new and all(r["state"] in ("success", "failed") for r in new):
                self.scored_by_airflow |= {r["dag_run_id"] for r in new}
                states = [r["state"] for r in new]
                record.outcome["airflow_scoring"] = states
                if states != ["success"]:
                    record.problems.append(f"Airflow's scoring after it: {states}")
                self.say(f"run {record.planned.index}: Airflow's scoring {states}")
                return
            time.sleep(2)
        record.problems.append(f"no Airflow scoring run final within {RUN_TIMEOUT_S:g} s")

    def check_idle(self) -> None:
        stack = self.stack
        after = self.records[-1].planned.index
        leftovers = checks.wait_for_no_leftovers(stack)
        problems = checks.services_problems(stack)
        problems += _retrying(checks.held_slots_problems)
        registry, registry_figures = _retrying(checks.registry_problems)
        problems += registry
        objects, object_figures = _retrying(lambda: self.ledger.record_and_compare(stack.store()))
        problems += [p for p in objects if self.counts(p)]
        hosts = checks.host_tmp(stack)
        now = checks.root_tmp_entries(exclude=stack.own_tmp())
        # Each Prefect worker's runner folder, the live one's or one Prefect left behind, is
        # listed apart with what became of its worker; the baseline holds the first.
        workers = {e: how for e, how in stack.worker_folders.items() if e in now}
        root_tmp = now - self.baseline["root_tmp"] - set(workers)
        figures = {
            **registry_figures,
            **object_figures,
            "hosts": hosts,
            # Files left in the hosts' /tmp beside Spark's work dir, and their growth in KiB.
            "host_tmp_files": sum(len(h["files"]) for h in hosts.values()),
            "host_tmp_growth_kib": sum(h["kib"] for h in hosts.values())
            - sum(h["kib"] for h in self.baseline["hosts"].values()),
            "root_tmp_new": sorted(root_tmp),
            "worker_folders": workers,
        }
        self.idle.append(IdleCheck(after, problems, leftovers, figures))
        if problems or leftovers:
            self.say(f"after run {after}: problems {problems}, leftovers {leftovers}")

    def counts(self, problem: str) -> bool:
        """A damaged object still in use counts once a run asked for after the damage has
        completed: it should have been replaced."""
        if "damaged by the soak" not in problem:
            return True
        for index, _kind, what in self.damage:
            if what in problem:
                return any(
                    r.planned.index > index and r.outcome.get("state") == "COMPLETED"
                    for r in self.records
                )
        return True


def _spark_slots(limit: int) -> None:
    """Size Prefect's ``spark-slots`` limit to every host the soak may use (the spare one joins
    for the runs that lose it), as an operator does when a cluster grows."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from hvdflow.flows.prefect.spark_slots import SPARK_SLOTS

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=SPARK_SLOTS, limit=limit)
        )


def _retrying(call, attempts: int = 20, pause_s: float = 3.0):
    """``call()`` again while a service it needs is restarting."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(pause_s)
    return None
