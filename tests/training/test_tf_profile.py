"""Reading TensorFlow's profile of training steps: exact shares, and a real profile of a fit."""

import numpy as np
import pytest

from hvdflow.training.tf_profile import host_events, newest_profile, step_breakdown


def write_space(path, threads: dict[str, list[tuple[str, float, float]]]) -> None:
    """An .xplane.pb whose host plane has a line per thread of (event, begin s, end s)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids: dict[str, int] = {}
    for line_id, (thread, events) in enumerate(threads.items()):
        line = plane.lines.add(id=line_id, name=thread, timestamp_ns=1_000_000_000)
        for name, begin, end in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].id = ids[name]
                plane.event_metadata[ids[name]].name = name
            line.events.add(
                metadata_id=ids[name],
                offset_ps=int(begin * 1e12),
                duration_ps=int((end - begin) * 1e12),
            )
    # A device plane's events are not the host's steps: they must not count.
    space.planes.add(name="/device:GPU:0")
    path.write_bytes(space.SerializeToString())


@pytest.mark.unit
def test_a_steps_wall_clock_splits_into_ops_input_waiting_and_between_steps(tmp_path):
    # Two steps of 1 s each, 0.5 s apart: 2.5 s from the first start to the last end.
    # Step 1: ops 0.0-0.6 (a kernel 0.1-0.4 inside), its batch fetched 0.0-0.1 by an op, then
    # waiting for its allreduce until 1.0. Step 2: ops 1.5-2.3, waiting until 2.5.
    profile = tmp_path / "plugins" / "profile" / "run1"
    profile.mkdir(parents=True)
    write_space(
        profile / "host.xplane.pb",
        {
            "python": [("train_function", 0.0, 1.0), ("train_function", 1.5, 2.5)],
            "tf_Compute/1": [
                ("ExecutorState::Process", 0.0, 0.6),
                ("dense/MatMul:MatMul", 0.1, 0.4),
                ("ExecutorState::Process", 1.5, 2.3),
                ("dense/MatMul:MatMul", 1.6, 1.9),
            ],
            "tf_data_iterator_get_next/2": [("IteratorGetNextOp::DoCompute", 0.0, 0.1)],
        },
    )
    shares = step_breakdown(host_events(newest_profile(str(tmp_path))))
    kernels = shares.pop("top_kernels_ms_per_step")
    assert kernels == pytest.approx({"dense/MatMul:MatMul": 300.0})
    assert shares == pytest.approx(
        {
            "steps": 2,
            "step_ms": 1250.0,
            "ops": 1.4 / 2.5,
            "input": 0.1 / 2.5,
            "waiting_in_step": 0.6 / 2.5,  # the fetch lies inside the ops: counted once
            "between_steps": 0.5 / 2.5,
        }
    )


@pytest.mark.unit
def test_a_folder_without_a_profile_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match="no TensorFlow profile"):
        newest_profile(str(tmp_path))


@pytest.mark.unit
def test_the_profile_callback_profiles_exactly_the_batches_asked_for(tmp_path):
    import tensorflow as tf

    from hvdflow.training.callbacks import ProfileCallback

    with pytest.raises(ValueError, match=r"profile_batches \(3, 3\)"):
        ProfileCallback(str(tmp_path), 3, 3)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
    # Batches 3, 4 and 5 of 8 per epoch: two epochs, the profile inside the first.
    model.fit(
        x, y, batch_size=8, epochs=2, verbose=0, callbacks=[ProfileCallback(str(tmp_path), 3, 6)]
    )
    shares = step_breakdown(host_events(newest_profile(str(tmp_path))))
    assert shares["steps"] == 3
    assert shares["ops"] > 0 and shares["between_steps"] > 0
    assert shares["ops"] + shares["waiting_in_step"] + shares["between_steps"] == pytest.approx(
        1.0, abs=shares["input"] + 1e-9
    )


@pytest.mark.integration
def test_tensorboards_profile_tab_reads_the_profile_the_callback_wrote(tmp_path):
    """docs/profiling.md sends users to TensorBoard's Profile tab (the ``profile`` extra): its
    plugin lists the profile as a run and serves its pages."""
    import glob
    import gzip
    import json
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    import tensorflow as tf

    from hvdflow.infra.services._process import free_port
    from hvdflow.training.callbacks import ProfileCallback

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.zeros((32, 4), "float32"), np.zeros((32, 2), "float32")
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[ProfileCallback(str(tmp_path), 1, 3)])
    (written,) = glob.glob(f"{tmp_path}/plugins/profile/*/*.xplane.pb")
    run = os.path.basename(os.path.dirname(written))
    host = os.path.basename(written).removesuffix(".xplane.pb")

    port = free_port()
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    server = subprocess.Popen(
        [tensorboard, "--logdir", str(tmp_path), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def get(path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            body = reply.read()
            # The plugin gzips its answers whatever the request accepts.
            gzipped = reply.headers.get("Content-Encoding") == "gzip"
            return json.loads(gzip.decompress(body) if gzipped else body)

    try:
        deadline, plugins = time.monotonic() + 60, None
        while plugins is None:
            assert time.monotonic() < deadline, "TensorBoard did not answer in 60 s"
            assert server.poll() is None, "TensorBoard exited"
            try:
                plugins = get("/data/plugins_listing")
            except OSError:
                time.sleep(0.5)
        assert plugins.get("profile", {}).get("enabled"), "no Profile tab: the profile extra?"
        assert get("/data/plugin/profile/runs") == [run]
        tools = get(f"/data/plugin/profile/run_tools?run={run}")
        assert {"overview_page^", "trace_viewer@^"} <= set(tools)
        overview = get(f"/data/plugin/profile/data?run={run}&tag=overview_page%5E&host={host}")
        assert overview and "cols" in overview[0]
    finally:
        server.terminate()
        server.wait(timeout=30)
