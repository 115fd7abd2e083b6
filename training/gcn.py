"""Kipf and Welling's two-layer GCN on Cora-format graphs, trained with Horovod or alone.

Cora's format: ``<name>.content`` has one line per node, ``<id> <feature>... <class>``;
``<name>.cites`` has one edge per line, ``<cited id> <citing id>``. Training is full-batch on
the whole graph; with Horovod each rank takes its share of the labelled training nodes and
``DistributedGradientTape`` averages the gradients. The paper saw no speed-up from more ranks on
Cora: one step on a small graph is too cheap to amortise an allreduce.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hvdflow.infra.launcher import log_to_driver
from hvdflow.training.autograph import run_horovod_unconverted
from hvdflow.training.epoch_log import epoch_done_line, epoch_started_line
from hvdflow.training.result import RankResult


def load_cora(content_path: str, cites_path: str):
    """(features [N, F] float32, labels [N] int32, adjacency [N, N] float32, class names)."""
    ids, features, classes = [], [], []
    with open(content_path) as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) < 3:
                raise ValueError(
                    f"{content_path}:{number}: expected '<id> <features>... <class>', got {line!r}"
                )
            ids.append(parts[0])
            features.append([float(v) for v in parts[1:-1]])
            classes.append(parts[-1])
    index = {node: i for i, node in enumerate(ids)}
    names = sorted(set(classes))
    labels = np.array([names.index(c) for c in classes], np.int32)
    adjacency = np.zeros((len(ids), len(ids)), np.float32)
    with open(cites_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 2:
                continue
            a, b = (index.get(p) for p in parts)
            if a is not None and b is not None:  # Cora cites papers outside the set: skip them
                adjacency[a, b] = adjacency[b, a] = 1.0
    return np.array(features, np.float32), labels, adjacency, names


def normalized_adjacency(adjacency: np.ndarray) -> np.ndarray:
    """D^-1/2 (A + I) D^-1/2, the GCN propagation matrix."""
    a = adjacency + np.eye(len(adjacency), dtype=np.float32)
    d = 1.0 / np.sqrt(a.sum(axis=1))
    return (a * d[:, None]) * d[None, :]


def write_karate_cora(root: str) -> tuple[str, str]:
    """Zachary's karate club (networkx, real data) in Cora's format: one-hot node features,
    the club each member joined as the class."""
    import networkx as nx

    graph = nx.karate_club_graph()
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    content, cites = base / "karate.content", base / "karate.cites"
    n = graph.number_of_nodes()
    with open(content, "w") as f:
        for node in graph.nodes:
            onehot = " ".join("1" if i == node else "0" for i in range(n))
            f.write(f"{node} {onehot} {graph.nodes[node]['club'].replace(' ', '_')}\n")
    with open(cites, "w") as f:
        for a, b in graph.edges:
            f.write(f"{a} {b}\n")
    return str(content), str(cites)


def train_split(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Indices of ``per_class`` labelled training nodes per class (Kipf and Welling use 20),
    at most half of a class, so that every class keeps nodes to validate on."""
    rng = np.random.default_rng(seed)
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        take = min(per_class, max(1, len(members) // 2))
        chosen.append(rng.permutation(members)[:take])
    return np.sort(np.concatenate(chosen))


def train_gcn(
    *,
    content_path: str,
    cites_path: str,
    epochs: int = 200,
    learning_rate: float = 0.01,
    hidden: int = 16,
    dropout: float = 0.5,
    train_per_class: int = 20,
    seed: int = 0,
    use_horovod: bool = True,
    **_ignored,
) -> RankResult:
    """Train; return history, per-epoch times and nodes per epoch, the record
    ``train_classifier`` returns."""
    import tensorflow as tf

    if use_horovod:
        import horovod.tensorflow as hvd

        hvd.init()
        run_horovod_unconverted()
        rank, size = hvd.rank(), hvd.size()
    else:
        rank, size = 0, 1
    tf.keras.utils.set_random_seed(seed)
    features, labels, adjacency, names = load_cora(content_path, cites_path)
    a_hat = tf.constant(normalized_adjacency(adjacency))
    x, y = tf.constant(features), tf.constant(labels)
    train_nodes = train_split(labels, train_per_class, seed)
    val_mask = np.ones(len(labels), bool)
    val_mask[train_nodes] = False
    mine = tf.constant(train_nodes[rank::size])  # this rank's share of the labelled nodes

    w0 = tf.Variable(tf.keras.initializers.GlorotUniform(seed)((features.shape[1], hidden)))
    w1 = tf.Variable(tf.keras.initializers.GlorotUniform(seed + 1)((hidden, len(names))))
    variables = [w0, w1]
    # Not scaled by the ranks: they split the one full batch of labelled nodes and average
    # their gradients, so the global batch, and with it the right rate, does not change.
    optimizer = tf.keras.optimizers.Adam(learning_rate)

    def forward(training: bool):
        h = tf.nn.relu(a_hat @ (x @ w0))
        if training:
            h = tf.nn.dropout(h, dropout)
        return a_hat @ (h @ w1)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = tf.gather(forward(True), mine)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(
                    tf.gather(y, mine), logits, from_logits=True
                )
            )
        if use_horovod:
            tape = hvd.DistributedGradientTape(tape)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    history: dict[str, list[float]] = {"loss": [], "val_accuracy": []}
    epoch_times = []
    started = time.perf_counter()
    for epoch in range(epochs):
        if rank == 0:
            # A rank's stdout streams to the driver line by line, as the epoch lines expect.
            print(epoch_started_line(epoch + 1, epochs), flush=True)  # noqa: T201
        began = time.perf_counter()
        loss = step()
        if epoch == 0 and use_horovod:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)
        predicted = tf.argmax(forward(False), axis=1, output_type=tf.int32).numpy()
        epoch_times.append(time.perf_counter() - began)
        history["loss"].append(float(loss))
        history["val_accuracy"].append(float((predicted[val_mask] == labels[val_mask]).mean()))
    if rank == 0:
        last = {"val_accuracy": history["val_accuracy"][-1]}
        log_to_driver(epoch_done_line(epochs, epochs, epoch_times[-1], last))
    return RankResult(
        size=size,
        history={key: tuple(values) for key, values in history.items()},
        epoch_times=tuple(epoch_times),
        train_seconds=time.perf_counter() - started,
        steps_per_epoch=1,
        images_per_epoch=len(train_nodes),  # labelled nodes trained on per epoch
        # Not scaled: the ranks split one full batch (see the optimizer above).
        scaled_learning_rate=learning_rate,
    )
