"""The training function HorovodRunner runs on every rank: an image classifier on Petastorm data.

Every argument is a plain value (URLs, counts, names), so the call pickles small and the same
function runs on the driver (np < 0), on local[N] and on a cluster.
"""

from __future__ import annotations

import time

from hvdflow.infra.launcher.rank_events import log_to_driver

# How long rank 0 waits for a tracking server that is down before it logs the model.
TRACKER_WAIT_S = 300.0


def train_classifier(
    *,
    train_url: str,
    val_url: str,
    train_rows: int,
    val_rows: int,
    num_classes: int,
    input_shape: tuple[int, ...],
    model_name: str,
    epochs: int = 2,
    batch_size: int = 32,
    learning_rate: float = 0.001,
    optimizer: str = "adam",
    lr_scaling: str = "auto",
    warmup_epochs: float = 0.0,
    chance_margin: float | None = None,
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    run_id: str | None = None,
    tracking_uri: str | None = None,
    registered_model_name: str | None = None,
    seed: int = 0,
    use_horovod: bool = True,
    checkpoint_url: str | None = None,
    checkpoint_keep: int = 2,
    engine: str = "horovod",
    mixed_precision: bool = False,
    fp16_compression: bool = False,
    threads: int | None = None,
    in_memory_max_mb: float = 1024.0,
) -> dict:
    """Train with Horovod; rank 0 logs to MLflow and returns history, timings and the model.

    ``engine``: ``"horovod"`` or ``"tf_collective"`` (``hvdflow.training.engines``); the same data,
    model, callbacks and logging either way. ``use_horovod=False`` is the plain single-process
    Keras baseline of the benchmark: no engine anywhere, every core to one process.

    ``mixed_precision``: Keras' ``mixed_float16`` policy (float16 compute, float32 variables and
    output). ``fp16_compression``: Horovod sends gradients as float16 (Horovod only).
    ``threads``: TensorFlow threads of this process (default: the host's cores shared by its
    ranks); the benchmark gives every condition the same budget per process.
    ``in_memory_max_mb``: a rank whose training shard decodes to at most this many MB holds it
    in memory after reading it once (``hvdflow.training.reader``); 0 always streams from Petastorm.

    ``lr_scaling`` and ``warmup_epochs``: how ``learning_rate`` follows the number of ranks
    (``training.optimizers``). ``chance_margin``: a training that ends no better than chance by
    this much in val_accuracy is not registered, and says why in ``result["rejected"]``
    (``training.quality``); a diverging loss stops it early (``result["stopped"]``). None
    judges nothing (the benchmark's conditions time training, whatever it reaches).

    ``checkpoint_url`` (``s3://...`` or a folder): rank 0 writes a checkpoint there at the end of
    every epoch, and a run that finds one there resumes after its epoch, with the model's and
    optimizer's state and the history of the epochs before (``hvdflow.training.checkpoints``).
    """
    from hvdflow.training.callbacks import (
        CheckpointCallback,
        DivergenceGuard,
        EpochTimer,
        LearningRateLog,
        LogCallback,
        MlflowEpochMetrics,
        ProgressCallback,
    )
    from hvdflow.training.engines import NONE, start_engine
    from hvdflow.training.models import build_model, model_input_shape
    from hvdflow.training.optimizers import learning_rate_plan, make_planned_optimizer
    from hvdflow.training.quality import rejection
    from hvdflow.training.reader import open_dataset, shard_megabytes, steps_per_epoch

    # First, before any TensorFlow op. Fair use of the CPU: the ranks on a host split its cores;
    # the baseline gets them all.
    engine_ = start_engine(
        engine if use_horovod else NONE, fp16_compression=fp16_compression, threads=threads
    )
    rank, size = engine_.rank, engine_.size
    if mixed_precision:
        import tensorflow as tf

        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    steps = steps_per_epoch(train_rows, size, batch_size)
    val_steps = steps_per_epoch(val_rows, size, batch_size) if val_rows else None
    plan = learning_rate_plan(optimizer, learning_rate, size, lr_scaling, warmup_epochs, steps)
    rate = plan.describe()
    if rank == 0:
        log_to_driver(f"learning rate: {rate}")
    with engine_.scope():
        model = build_model(model_name, model_input_shape(input_shape), num_classes, seed=seed)
        if mixed_precision:
            model = _float32_output(model)
        if weights_uri:
            from hvdflow.training.weights import fetch_weights

            model.load_weights(fetch_weights(weights_uri, weights_sha256))
        opt = engine_.optimizer(make_planned_optimizer(optimizer, plan))
        model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    resumed, checkpoints, checkpoint = None, None, None
    if checkpoint_url:
        import tensorflow as tf

        from hvdflow.training.checkpoints import CheckpointStore

        checkpoints = CheckpointStore(checkpoint_url, keep=checkpoint_keep)
        # model.optimizer: with mixed precision, compile wrapped opt in a LossScaleOptimizer.
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        resumed = checkpoints.latest()
        if resumed is not None:  # every rank loads it: they start equal, as after a broadcast
            checkpoints.restore(checkpoint, resumed)
    initial_epoch = resumed.epoch if resumed else 0
    timer = EpochTimer()
    # The engine's first (they make the logs equal on every rank), then the stall watch's feed.
    watch = [ProgressCallback()] if use_horovod else []
    guard = DivergenceGuard(num_classes, rate, rank)
    callbacks = [*engine_.callbacks(), *watch, timer, LearningRateLog(plan), LogCallback(rank)]
    if rank == 0 and checkpoints is not None:
        callbacks.append(CheckpointCallback(checkpoints, checkpoint, resumed))
    if rank == 0 and run_id:
        import mlflow

        # Explicit: the driver's mlflow.set_tracking_uri() does not reach this process.
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        callbacks.append(MlflowEpochMetrics(run_id))
    if chance_margin is not None:
        callbacks.append(guard)  # last: the diverged epoch's metrics are logged first
    if resumed is not None and rank == 0:
        log_to_driver(
            f"resuming after epoch {resumed.epoch} from the checkpoint at "
            f"{checkpoints.url}/{resumed.folder}"
        )
    shard_mb = shard_megabytes(train_rows + val_rows, size, input_shape)
    in_memory = 0 < shard_mb <= in_memory_max_mb
    if rank == 0:
        log_to_driver(
            f"data: {shard_mb:.0f} MB per rank decoded, "
            + ("held in memory after the first read" if in_memory else "streamed by Petastorm")
            + f" (in_memory_max_mb={in_memory_max_mb:g})"
        )
    read = {"rank": rank, "size": size, "batch_size": batch_size, "in_memory": in_memory}
    with (
        open_dataset(train_url, seed=seed, **read) as train,
        open_dataset(val_url, shuffle=False, **read) as val,
    ):
        started = time.perf_counter()
        history = model.fit(
            engine_.distribute(train),
            steps_per_epoch=steps,
            epochs=epochs,
            initial_epoch=min(initial_epoch, epochs),
            validation_data=engine_.distribute(val) if val_steps else None,
            validation_steps=val_steps,
            callbacks=callbacks,
            verbose=2 if rank == 0 else 0,
        )
        train_s = time.perf_counter() - started
        if checkpoints is not None:
            checkpoints.close()
        example = next(iter(val if val_steps else train))[0][:4].numpy()

    whole = _whole_history(resumed, history.history)
    rejected = None
    if chance_margin is not None:
        rejected = rejection(whole, num_classes, chance_margin, rate)
    result = {
        "size": size,
        "history": whole,
        "epoch_times": (resumed.epoch_times if resumed else []) + timer.epoch_times,
        "resumed_from_epoch": initial_epoch,
        "train_seconds": train_s,
        "steps_per_epoch": steps,
        "images_per_epoch": steps * batch_size * size,
        "scaled_learning_rate": plan.target,
        "warmup_steps": plan.warmup_steps,
        "stopped": guard.reason,
        "rejected": rejected,
        "model_version": None,
    }
    if rank == 0 and rejected:
        log_to_driver(f"not registering the model: {rejected}")
    if rank == 0 and run_id and not rejected:
        import mlflow

        from hvdflow.infra.tracking import wait_until_reachable

        wait_until_reachable(mlflow.get_tracking_uri(), TRACKER_WAIT_S, log_to_driver)
        result["model_version"] = _log_model(model, example, run_id, registered_model_name)
    return result


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


def _log_model(model, example, run_id, registered_model_name):
    import mlflow
    import mlflow.tensorflow
    import tensorflow as tf
    from mlflow.models import infer_signature

    # Registry consumers get the architecture and weights only: the compiled model carries
    # DistributedOptimizer's Horovod ops, which a serving process without horovod cannot load.
    # MLflow predicts on the input example to check it: no progress bar in rank 0's output.
    tf.keras.utils.disable_interactive_logging()
    clean = tf.keras.models.clone_model(model)
    clean.set_weights(model.get_weights())
    signature = infer_signature(example, clean.predict(example, verbose=0))
    with mlflow.start_run(run_id=run_id):
        info = mlflow.tensorflow.log_model(
            clean,
            name="model",
            signature=signature,
            input_example=example,
            registered_model_name=registered_model_name,
        )
    version = getattr(info, "registered_model_version", None)
    return str(version) if version is not None else None
