"""The training function HorovodRunner runs on every rank: an image classifier on Petastorm data.

Its one argument is a ``TrainSpec`` of plain values, so the same call runs on the driver (np < 0),
on local[N] and on a cluster. It reads as its phases: engine and rate, compiled model, checkpoint
resumed from, callbacks, fit, verdict and registered model.
"""

from __future__ import annotations

import time

from hvdflow.infra.launcher import log_to_driver
from hvdflow.training.checkpoints import CheckpointStore
from hvdflow.training.engines import NONE, start_engine
from hvdflow.training.finish import (
    class_labels,
    finish_training,
    plan_training,
    register_model,
    track_to,
)
from hvdflow.training.models import build_model, model_input_shape
from hvdflow.training.optimizers import make_planned_optimizer
from hvdflow.training.parquet_reader import load_rows
from hvdflow.training.profiling import log_profile, profile_folder
from hvdflow.training.reader import open_dataset, shard_megabytes, steps_per_epoch
from hvdflow.training.result import RankResult
from hvdflow.training.spec import TrainSpec


def train_classifier(spec: TrainSpec) -> RankResult:
    """Train ``spec`` on this rank; rank 0 logs to MLflow. Returns the history, timings and the
    registered version (``training.result``). ``TrainSpec`` says what each field does.

    ``spec.engine``: ``"horovod"`` or ``"tf_collective"``; the same data, model, callbacks and
    logging either way. A training that ends no better than chance by ``chance_margin`` is not
    registered (``RankResult.rejected``); a diverging loss stops it early (``RankResult.stopped``).
    ``checkpoint_url``: rank 0 checkpoints every epoch, and a run that finds one resumes after it.
    """
    # Lazy: the driver imports this module to send the function and must not load TensorFlow.
    from hvdflow.training.callbacks import DivergenceGuard, EpochTimer, InputWait  # noqa: PLC0415 (lazy: it loads TensorFlow)

    data = spec.data
    # First, before any TensorFlow op: the ranks on a host split its cores.
    engine = start_engine(
        spec.engine if spec.use_horovod else NONE,
        fp16_compression=spec.fp16_compression,
        threads=spec.threads,
    )
    batch, steps, plan = plan_training(spec, engine.rank, engine.size)
    model = _compiled_model(spec, engine, plan)
    checkpoints, checkpoint, resumed = _resume(spec, model, engine.rank)
    timer = EpochTimer()
    guard = DivergenceGuard(data.num_classes, plan.describe(), engine.rank)
    profile = profile_folder(spec, engine.rank)
    callbacks = _callbacks(
        spec, engine, plan, timer, guard, checkpoints, checkpoint, resumed, profile
    )
    waits = InputWait(engine.rank)  # with the epoch's time, before anything reads the logs
    callbacks.insert(callbacks.index(timer) + 1, waits)
    if spec.eval_every > 0 and data.val_rows:
        callbacks.append(_interval_evaluation(spec, engine, steps, batch, callbacks))
    history, train_s, example = _fit(spec, engine, model, steps, batch, callbacks, resumed, waits)
    if checkpoints is not None:
        checkpoints.close()
    profiled = log_profile(profile, spec) if profile and not spec.profile_dir else None

    return finish_training(
        spec,
        rank=engine.rank,
        size=engine.size,
        plan=plan,
        history=_whole_history(resumed, history),
        epoch_times=(resumed.epoch_times if resumed else []) + timer.epoch_times,
        train_seconds=train_s,
        steps=steps,
        batch=batch,
        resumed=resumed,
        stopped=guard.reason,
        registers=bool(spec.tracking),
        log_model=lambda: _log_model(model, example, spec),
        profile=profiled,
    )


def _compiled_model(spec: TrainSpec, engine, plan):
    """The model, built in the engine's scope with any staged weights, compiled."""
    if spec.mixed_precision:
        import tensorflow as tf

        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    data = spec.data
    with engine.scope():
        model = build_model(
            spec.model_name, model_input_shape(data.input_shape), data.num_classes, seed=spec.seed
        )
        if spec.mixed_precision:
            model = _float32_output(model)
        if spec.weights_uri:
            from hvdflow.training.weights import fetch_weights  # noqa: PLC0415 (lazy: it loads boto3)

            model.load_weights(fetch_weights(spec.weights_uri, spec.weights_sha256))
        opt = engine.optimizer(make_planned_optimizer(spec.optimizer.name, plan))
        model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _resume(spec: TrainSpec, model, rank: int):
    """The checkpoint store, checkpoint object and checkpoint resumed from (or None): every rank
    loads it, so they start equal, as after a broadcast."""
    if not spec.checkpoint_url:
        return None, None, None
    import tensorflow as tf

    checkpoints = CheckpointStore(spec.checkpoint_url, keep=spec.checkpoint_keep)
    # model.optimizer: with mixed precision, compile wrapped opt in a LossScaleOptimizer.
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    resumed = checkpoints.latest()
    if resumed is not None:
        checkpoints.restore(checkpoint, resumed)
        if rank == 0:
            log_to_driver(
                f"resuming after epoch {resumed.epoch} from the checkpoint at "
                f"{checkpoints.url}/{resumed.folder}"
            )
    return checkpoints, checkpoint, resumed


def _callbacks(
    spec: TrainSpec, engine, plan, timer, guard, checkpoints, checkpoint, resumed, profile
):
    """The engine's callbacks first (they make the logs equal on every rank); the divergence guard
    last, so the diverged epoch's metrics are logged first."""
    from hvdflow.training.callbacks import (  # noqa: PLC0415 (lazy: it loads TensorFlow)
        CheckpointCallback,
        LearningRateLog,
        LogCallback,
        MlflowEpochMetrics,
        ProfileCallback,
        ProgressCallback,
    )

    rank = engine.rank
    watch = [ProgressCallback()] if spec.use_horovod else []
    callbacks = [*engine.callbacks(), *watch, timer, LearningRateLog(plan), LogCallback(rank)]
    if rank == 0 and checkpoints is not None:
        callbacks.append(CheckpointCallback(checkpoints, checkpoint, resumed))
    if rank == 0 and spec.tracking:
        callbacks.append(MlflowEpochMetrics(track_to(spec)))
    if profile:
        callbacks.append(ProfileCallback(profile, *spec.profile_batches))
    if spec.chance_margin is not None:
        callbacks.append(guard)
    return callbacks


def _interval_evaluation(spec: TrainSpec, engine, steps: int, batch: int, callbacks):
    """Evaluation of this rank's part of a fixed validation subset every ``spec.eval_every`` of an
    epoch; rank 0 sends each to the MLflow run where ``callbacks`` log to one."""
    from hvdflow.training.callbacks import MlflowEpochMetrics  # noqa: PLC0415 (lazy: TensorFlow)
    from hvdflow.training.interval_eval import (  # noqa: PLC0415 (lazy: it loads TensorFlow)
        IntervalEvaluation,
        eval_interval_steps,
        subset_rows,
    )

    # By the stored order (pyarrow, whatever spec.reader): Petastorm's workers may hand row
    # groups over in any order, and the subset must be the same images in every run.
    rows = subset_rows(spec.data.val_rows, spec.eval_images, spec.seed)[engine.rank :: engine.size]
    images, labels = load_rows(spec.data.val_url, rows)
    return IntervalEvaluation(
        engine,
        images,
        labels,
        every_steps=eval_interval_steps(steps, spec.eval_every),
        steps_per_epoch=steps,
        images_per_step=batch * engine.size,
        on_evaluation=next(
            (c.log_evaluation for c in callbacks if isinstance(c, MlflowEpochMetrics)), None
        ),
    )


def _fit(spec: TrainSpec, engine, model, steps: int, batch: int, callbacks, resumed, waits):
    """``model.fit`` on this rank's shards, ``waits`` watching the training batches arrive;
    the history, its seconds and an input example."""
    data, rank, size = spec.data, engine.rank, engine.size
    val_steps = steps_per_epoch(data.val_rows, size, batch) if data.val_rows else None
    shard_mb = shard_megabytes(data.train_rows + data.val_rows, size, data.input_shape)
    in_memory = 0 < shard_mb <= spec.in_memory_max_mb
    if rank == 0:
        log_to_driver(
            f"data: {shard_mb:.0f} MB per rank decoded, "
            + ("held in memory after the first read" if in_memory else "streamed")
            + f" (in_memory_max_mb={spec.in_memory_max_mb:g}), read by {spec.reader}"
        )
    read = {
        "rank": rank,
        "size": size,
        "batch_size": batch,
        "in_memory": in_memory,
        "reader": spec.reader,
    }
    with (
        open_dataset(data.train_url, seed=spec.seed, **read) as train,
        open_dataset(data.val_url, shuffle=False, **read) as val,
    ):
        started = time.perf_counter()
        history = model.fit(
            engine.distribute(waits.watch(train)),
            steps_per_epoch=steps,
            epochs=spec.epochs,
            initial_epoch=min(resumed.epoch if resumed else 0, spec.epochs),
            validation_data=engine.distribute(val) if val_steps else None,
            validation_steps=val_steps,
            callbacks=callbacks,
            verbose=2 if rank == 0 else 0,
        )
        train_s = time.perf_counter() - started
        example = next(iter(val if val_steps else train))[0][:4].numpy()
    return history.history, train_s, example


def _float32_output(model):
    """``model`` with its output cast to float32: softmax in float16 loses small probabilities
    (Keras' mixed-precision guide)."""
    import tensorflow as tf

    output = tf.keras.layers.Activation("linear", dtype="float32", name="float32_output")(
        model.outputs[0]
    )
    return tf.keras.Model(model.inputs, output, name=model.name)


def _whole_history(resumed, new: dict) -> dict[str, list[float]]:
    """The checkpoint's epochs followed by this run's: every epoch of the training, once."""
    merged = {k: list(v) for k, v in (resumed.history if resumed else {}).items()}
    for key, values in new.items():
        merged.setdefault(key, []).extend(float(v) for v in values)
    return merged


def _log_model(model, example, spec: TrainSpec) -> tuple[str | None, dict | None]:
    """Log and register the ImageClassifier of ``model``; evaluate it on the validation split.
    Returns (the registered version, the evaluation's metrics and artifacts)."""
    import tensorflow as tf

    from hvdflow.serving.classifier import ImageClassifier  # noqa: PLC0415 (lazy: it loads MLflow)
    from hvdflow.serving.package import log_classifier  # noqa: PLC0415 (lazy: it loads MLflow)

    # Architecture and weights only: the compiled model carries DistributedOptimizer's Horovod
    # ops, which a serving process cannot load. MLflow predicts on the example: no progress bar.
    tf.keras.utils.disable_interactive_logging()
    clean = tf.keras.models.clone_model(model)
    clean.set_weights(model.get_weights())
    labels = class_labels(spec)
    classifier = ImageClassifier(labels, clean.input_shape[1:])
    classifier.network = clean
    return register_model(
        spec, lambda name: log_classifier(clean, labels, example, name), classifier, spec.reader
    )
