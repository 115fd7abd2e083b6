"""What one GPU does with the paper's Caltech101 networks: a reference for hvdflow's CPU figures.

Not hvdflow's stack. hvdflow's ranks need TensorFlow 2.15 (the last Keras 2, which Horovod 0.28
needs), and the GPU machines lent to this project have Python 3.12, no network, and no TensorFlow;
2.15 has no wheel for 3.12 and a newer TensorFlow with its CUDA libraries is far larger than what
can be carried there (docs/benchmarks/gpu.md). What those machines do have is PyTorch, so this
script builds the same networks as ``hvdflow.training.models`` (the keras.applications base
without its top, global average pooling, a new softmax head; SGD at the recipe's 0.01) with Keras
3 on the PyTorch backend, and times them the way the benchmark does: images per second over whole
epochs after the first, on in-memory images fed from the host.

    KERAS_BACKEND=torch python3 scripts/gpu_reference.py [--out FILE.json]

Prints one table (a row per model, precision, batch and device) and, with ``--out``, writes
the figures and the software seen. The rows on the host's CPU cores are the same networks on the
same machine, side by side, so the GPU's factor is measured, not assumed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402 (after the backend is chosen)
import numpy as np  # noqa: E402

CLASSES = 101  # Caltech101's object classes
SHAPES = {"vgg16": (224, 224, 3), "inceptionv3": (299, 299, 3)}
BASES = {"vgg16": "VGG16", "inceptionv3": "InceptionV3"}
EPOCHS = 3  # the first warms up (kernels chosen, memory allocated); the others are timed


def build(model: str) -> keras.Model:
    """As ``hvdflow.training.models._application``: the base, pooled, a new softmax head."""
    base = getattr(keras.applications, BASES[model])(
        include_top=False, weights=None, input_shape=SHAPES[model], pooling="avg"
    )
    outputs = keras.layers.Dense(CLASSES, activation="softmax")(base.output)
    network = keras.Model(base.input, outputs, name=model)
    network.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return network


def synchronize() -> None:
    """Wait for the device's queued work, so that a timer read after it counts that work."""
    if keras.backend.backend() == "torch":
        import torch  # noqa: PLC0415 (only with the torch backend)

        if torch.cuda.is_available():
            torch.cuda.synchronize()


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        synchronize()
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        synchronize()
        self.seconds.append(time.perf_counter() - self._started)


def measure(model: str, batch: int, images: int, precision: str, device: str, feed: str) -> dict:
    """Images per second of ``model`` training on ``device``. ``feed="host"``: ``fit`` on
    in-memory images, copied to the device batch by batch, as a rank's reader feeds it;
    ``"device"``: one batch already on the device, trained on again and again (the compute
    alone, nothing to feed)."""
    keras.mixed_precision.set_global_policy(precision)
    rng = np.random.default_rng(0)
    steps = images // batch
    # On the CPU, no scope: Keras on PyTorch under keras.device("cpu:0") computed no gradients
    # (seen on the H200 machine, 2026-11-26); a process that sees no GPU trains on the CPU anyway.
    scope = keras.device(device) if device.startswith("gpu") else contextlib.nullcontext()
    with scope:
        network = build(model)
        if feed == "host":
            x = rng.random((images, *SHAPES[model]), dtype=np.float32)
            y = rng.integers(0, CLASSES, images)
            timer = EpochTimer()
            network.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0, callbacks=[timer])
            seconds = timer.seconds
        else:
            x = keras.ops.convert_to_tensor(rng.random((batch, *SHAPES[model]), dtype=np.float32))
            y = keras.ops.convert_to_tensor(rng.integers(0, CLASSES, batch))
            seconds = []
            for _ in range(EPOCHS):
                synchronize()
                started = time.perf_counter()
                for _ in range(steps):
                    network.train_on_batch(x, y)
                synchronize()
                seconds.append(time.perf_counter() - started)
    steady = seconds[1:]
    return {
        "model": model,
        "input": "x".join(map(str, SHAPES[model][:2])),
        "precision": precision,
        "batch": batch,
        "device": device,
        "feed": feed,
        "images_per_epoch": steps * batch,
        "first_epoch_s": round(seconds[0], 3),
        "epoch_s": [round(s, 3) for s in steady],
        "images_per_s": round(steps * batch * len(steady) / sum(steady), 1),
    }


def cpu_rows(args) -> list[dict]:
    """The CPU rows, from a process of their own that sees no GPU: the same networks on the
    machine's cores (with a GPU present, Keras on PyTorch trains nothing under a CPU scope)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "cpu.json")
        argv = [sys.executable, __file__, "--cpu-only", "--out", out, "--models", args.models]
        argv += ["--cpu-images", str(args.cpu_images), "--cpu-batch", str(args.cpu_batch)]
        subprocess.run(argv, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, check=True)
        with open(out) as f:
            return json.load(f)["rows"]


def software() -> dict:
    seen = {
        "python": platform.python_version(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "tensorflow_importable": importlib.util.find_spec("tensorflow") is not None,
        "horovod_importable": importlib.util.find_spec("horovod") is not None,
        "java_on_path": shutil.which("java") is not None,
        "cpu_cores": os.cpu_count(),
    }
    if keras.backend.backend() == "torch":
        import torch  # noqa: PLC0415 (only with the torch backend)

        seen["torch"] = torch.__version__
        seen["cuda"] = torch.version.cuda
        seen["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        seen["cudnn_tf32"] = torch.backends.cudnn.allow_tf32
        seen["matmul_tf32"] = torch.backends.cuda.matmul.allow_tf32
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the figures and the software seen here (JSON)")
    parser.add_argument("--gpu-images", type=int, default=1024, help="images per GPU epoch")
    parser.add_argument("--cpu-images", type=int, default=64, help="images per CPU epoch")
    parser.add_argument("--cpu-batch", type=int, default=32, help="batch of the CPU rows")
    parser.add_argument("--models", default="vgg16,inceptionv3")
    parser.add_argument("--cpu-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    seen = software()
    print(json.dumps(seen), flush=True)
    conditions = []
    for model in args.models.split(","):
        if args.cpu_only:
            conditions.append((model, args.cpu_batch, args.cpu_images, "float32", "cpu:0", "host"))
            continue
        if not seen.get("gpu"):
            continue
        for feed in ("host", "device"):
            for precision in ("float32", "mixed_bfloat16"):
                for batch in (32, 128):
                    conditions.append((model, batch, args.gpu_images, precision, "gpu:0", feed))
    rows = []
    for condition in conditions:
        try:
            row = measure(*condition)
        except Exception as e:  # one condition that cannot run (memory, a kernel) is a finding
            print(f"{condition}: {e!r}", flush=True)
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
    if not args.cpu_only:
        rows += cpu_rows(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"software": seen, "rows": rows}, f, indent=2)

    cpu = {r["model"]: r["images_per_s"] for r in rows if r["device"] == "cpu:0"}
    print("\n| model | input | precision | batch | device | fed from | images/s | x the CPU row |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        factor = r["images_per_s"] / cpu[r["model"]] if cpu.get(r["model"]) else float("nan")
        print(
            f"| {r['model']} | {r['input']} | {r['precision']} | {r['batch']} | {r['device']} "
            f"| {r['feed']} | {r['images_per_s']:.1f} | {factor:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
