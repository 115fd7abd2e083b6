"""The training function HorovodRunner runs on every rank: an image classifier on Petastorm data.

Every argument is a plain value (URLs, counts, names), so the call pickles small and the same
function runs on the driver (np < 0), on local[N] and on a cluster.
"""

from __future__ import annotations

import time


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
    learning_rate: float = 0.05,
    optimizer: str = "adam",
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    run_id: str | None = None,
    tracking_uri: str | None = None,
    registered_model_name: str | None = None,
    seed: int = 0,
    use_horovod: bool = True,
) -> dict:
    """Train with Horovod; rank 0 logs to MLflow and returns history, timings and the model.

    ``use_horovod=False`` is the plain single-process Keras baseline of the benchmark: the same
    data, model and callbacks, no Horovod anywhere, every core to one process.
    """
    from training.callbacks import EpochTimer, LogCallback, MlflowEpochMetrics
    from training.models import build_model, model_input_shape
    from training.optimizers import make_optimizer, scaled_learning_rate
    from training.reader import open_dataset, steps_per_epoch
    from training.threads import share_cores, use_threads

    if use_horovod:
        import horovod.tensorflow.keras as hvd

        hvd.init()
        rank, size, local_size = hvd.rank(), hvd.size(), hvd.local_size()
    else:
        rank, size, local_size = 0, 1, 1
    # Fair use of the CPU: the ranks on a host split its cores; the baseline gets them all.
    use_threads(share_cores(local_size))

    model = build_model(model_name, model_input_shape(input_shape), num_classes, seed=seed)
    if weights_uri:
        from training.weights import fetch_weights

        model.load_weights(fetch_weights(weights_uri, weights_sha256))
    scaled_lr = scaled_learning_rate(learning_rate, size)
    opt = make_optimizer(optimizer, scaled_lr)
    if use_horovod:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    timer = EpochTimer()
    callbacks = [timer, LogCallback(rank)]
    if use_horovod:
        callbacks = [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),  # validation metrics averaged over ranks
            *callbacks,
        ]
    if rank == 0 and run_id:
        import mlflow

        # Explicit: the driver's mlflow.set_tracking_uri() does not reach this process.
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        callbacks.append(MlflowEpochMetrics(run_id))
    steps = steps_per_epoch(train_rows, size, batch_size)
    val_steps = steps_per_epoch(val_rows, size, batch_size) if val_rows else None
    with (
        open_dataset(train_url, rank=rank, size=size, batch_size=batch_size, seed=seed) as train,
        open_dataset(val_url, rank=rank, size=size, batch_size=batch_size, shuffle=False) as val,
    ):
        started = time.perf_counter()
        history = model.fit(
            train,
            steps_per_epoch=steps,
            epochs=epochs,
            validation_data=val if val_steps else None,
            validation_steps=val_steps,
            callbacks=callbacks,
            verbose=2 if rank == 0 else 0,
        )
        train_s = time.perf_counter() - started
        example = next(iter(val if val_steps else train))[0][:4].numpy()

    result = {
        "size": size,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "epoch_times": timer.epoch_times,
        "train_seconds": train_s,
        "steps_per_epoch": steps,
        "images_per_epoch": steps * batch_size * size,
        "scaled_learning_rate": scaled_lr,
        "model_version": None,
    }
    if rank == 0 and run_id:
        result["model_version"] = _log_model(model, example, run_id, registered_model_name)
    return result


def _log_model(model, example, run_id, registered_model_name):
    import mlflow
    import mlflow.tensorflow
    import tensorflow as tf
    from mlflow.models import infer_signature

    # Registry consumers get the architecture and weights only: the compiled model carries
    # DistributedOptimizer's Horovod ops, which a serving process without horovod cannot load.
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
