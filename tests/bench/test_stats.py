import pytest

from bench.conditions import Measurement, parse_condition
from bench.stats import anova, markdown, plot, summary_table, tukey_against_np1


def m(condition, np, times, wall, images, rep=0):
    return Measurement(condition, np, rep, times, times[1:], wall, images)


MEASUREMENTS = [
    m("keras", 0, [1.0, 1.1, 0.9], 5.0, 1500),
    m("np=1", 1, [1.2, 1.3, 1.1], 6.0, 1500),
    m("np=2", 2, [0.7, 0.6, 0.8], 4.0, 1500),
]


@pytest.mark.unit
def test_conditions_parse_like_the_cli_writes_them():
    assert parse_condition("keras") == ("keras", 0)
    assert parse_condition("2") == ("np=2", 2)
    assert parse_condition("np=4") == ("np=4", 4)
    with pytest.raises(ValueError, match="expected 'keras' or a number of ranks"):
        parse_condition("0")


@pytest.mark.unit
def test_table_has_images_per_s_and_scaling_against_np1():
    rows = {r["condition"]: r for r in summary_table(MEASUREMENTS)}
    assert list(rows) == ["keras", "np=1", "np=2"]
    assert rows["np=1"]["images_per_s"] == pytest.approx(250.0)
    assert rows["np=2"]["images_per_s"] == pytest.approx(375.0)
    assert rows["np=2"]["scaling_efficiency"] == pytest.approx(375.0 / (2 * 250.0))
    assert rows["keras"]["scaling_efficiency"] is None
    assert rows["np=2"]["epoch_time_mean_s"] == pytest.approx(0.7)
    assert rows["np=2"]["epoch_time_std_s"] == pytest.approx(0.1)


@pytest.mark.unit
def test_anova_and_tukey_separate_different_epoch_times():
    f, p = anova(MEASUREMENTS)
    assert f > 10 and p < 0.01
    tukey = tukey_against_np1(MEASUREMENTS)
    assert set(tukey) == {"keras", "np=2"}
    assert tukey["np=2"] < 0.01  # clearly faster epochs
    assert tukey["keras"] > 0.05  # not distinguishable from np=1 with these samples


@pytest.mark.unit
def test_markdown_and_plots(tmp_path):
    rows = summary_table(MEASUREMENTS)
    text = markdown(rows, anova(MEASUREMENTS))
    assert "| np=2 | 0.700 ± 0.100 |" in text and "75.0% |" in text
    assert "One-way ANOVA on epoch times: F = " in text
    paths = plot(rows, tmp_path, "test")
    assert [p.name for p in paths] == ["images_per_s.png", "scaling_efficiency.png"]
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)
