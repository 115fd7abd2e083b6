import numpy as np
import pytest

from hvdflow import HorovodRunner
from hvdflow.training.gcn import (
    load_cora,
    normalized_adjacency,
    train_gcn,
    train_split,
    write_karate_cora,
)
from tests.helpers import wait_for_no_ranks


def write_cora(tmp_path):
    (tmp_path / "tiny.content").write_text(
        "p1 1 0 0 Neural_Networks\np2 0 1 0 Theory\np3 0 0 1 Theory\n"
    )
    # p9 is cited but not in the set, as in the real Cora files: the edge is skipped.
    (tmp_path / "tiny.cites").write_text("p1 p2\np2 p3\np9 p1\n")
    return str(tmp_path / "tiny.content"), str(tmp_path / "tiny.cites")


@pytest.mark.unit
def test_cora_files_parse_into_features_labels_and_a_symmetric_adjacency(tmp_path):
    features, labels, adjacency, names = load_cora(*write_cora(tmp_path))
    assert features.shape == (3, 3) and features[1].tolist() == [0.0, 1.0, 0.0]
    assert names == ["Neural_Networks", "Theory"] and labels.tolist() == [0, 1, 1]
    assert adjacency.tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]


@pytest.mark.unit
def test_a_malformed_content_line_names_file_and_line(tmp_path):
    (tmp_path / "bad.content").write_text("p1 1 A\np2\n")
    (tmp_path / "bad.cites").write_text("")
    with pytest.raises(ValueError, match="bad.content:2: expected"):
        load_cora(str(tmp_path / "bad.content"), str(tmp_path / "bad.cites"))


@pytest.mark.unit
def test_normalized_adjacency_of_two_linked_nodes():
    a_hat = normalized_adjacency(np.array([[0, 1], [1, 0]], np.float32))
    assert np.allclose(a_hat, [[0.5, 0.5], [0.5, 0.5]])


@pytest.mark.unit
def test_karate_club_in_cora_format(tmp_path):
    features, labels, adjacency, names = load_cora(*write_karate_cora(str(tmp_path)))
    assert features.shape == (34, 34) and adjacency.sum() == 2 * 78
    assert names == ["Mr._Hi", "Officer"]
    assert len(train_split(labels, 4, seed=0)) == 8
    # 20 per class would take all 17 members of each club: half of each is the cap.
    assert len(train_split(labels, 20, seed=0)) == 16


@pytest.mark.slow
def test_gcn_learns_the_karate_clubs_alone_and_with_two_ranks(tmp_path):
    content, cites = write_karate_cora(str(tmp_path))
    kwargs = {"content_path": content, "cites_path": cites, "epochs": 60, "train_per_class": 4}
    alone = train_gcn(**kwargs, use_horovod=False)
    assert alone.size == 1 and len(alone.epoch_times) == 60
    assert alone.final_val_accuracy > 0.7
    assert alone.history["loss"][-1] < alone.history["loss"][0]
    together = HorovodRunner(np=-2).run(train_gcn, **kwargs)
    assert together.size == 2 and together.final_val_accuracy > 0.7
    assert wait_for_no_ranks() == []
