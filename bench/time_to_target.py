"""Time to a target accuracy, repetition by repetition: does more ranks get there sooner, always?

The summary table (``bench.stats``) gives each condition's mean time to the target. A mean can
hide a repetition where np=2 got there later than np=1 (docs/benchmarks/training.md, "Time to
accuracy"), so this table pairs the conditions by repetition: repetitions run
interleaved (every condition once per round), and round r of a condition is compared with round
r of the reference. It gives each repetition's time, MLPerf Training's figure (the mean after
dropping the fastest and the slowest repetition), the median and its ratio to the reference's
median, in how many rounds the condition got there first, the images it trained until then, and
its final val_accuracy against the reference's. With evaluations every few steps
(``eval_every``), it also says what share of the training time they took. Each repetition trains
with its own seed (``bench.conditions.seeded_for``), so the rounds sample the training's noise,
not only the machine's.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from hvdflow.bench.conditions import Measurement


def by_repetition(measurements: list[Measurement]) -> dict[str, dict[int, Measurement]]:
    rounds: dict[str, dict[int, Measurement]] = defaultdict(dict)
    for m in measurements:
        rounds[m.condition][m.repetition] = m
    return dict(rounds)


def rows(
    measurements: list[Measurement], target: float, reference: str, conditions: list[str]
) -> list[dict]:
    """One row per condition (in ``conditions``' order), paired with ``reference`` by round."""
    rounds = by_repetition(measurements)
    ref = rounds.get(reference, {})
    ref_times = {r: m.seconds_to(target) for r, m in ref.items()}
    # As for every row: a median only where every round got there.
    ref_median = _median(list(ref_times.values())) if None not in ref_times.values() else None
    ref_final = _mean([m.final_val_accuracy for m in ref.values()])
    table = []
    for condition in conditions:
        runs = rounds.get(condition, {})
        times = {r: m.seconds_to(target) for r, m in sorted(runs.items())}
        reached = [t for t in times.values() if t is not None]
        every = len(reached) == len(times)
        median = _median(reached) if every else None
        paired = [r for r in times if r in ref_times and condition != reference]
        first = sum(
            1
            for r in paired
            if times[r] is not None and (ref_times[r] is None or times[r] < ref_times[r])
        )
        final = _mean([m.final_val_accuracy for m in runs.values()])
        images = [m.images_to(target) for m in runs.values()]
        shares = [s for m in runs.values() if (s := m.evaluation_share) is not None]
        table.append(
            {
                "condition": condition,
                "times_s": list(times.values()),
                "trimmed_mean_s": trimmed_mean(reached) if every else None,
                "median_s": median,
                "median_vs_reference": (
                    median / ref_median
                    if median is not None and ref_median and condition != reference
                    else None
                ),
                "first_in": first,
                "paired_rounds": len(paired),
                "images_to_target": (
                    statistics.median(images) if images and None not in images else None
                ),
                "final_val_accuracy": final,
                "final_vs_reference_points": (
                    100 * (final - ref_final)
                    if final is not None and ref_final is not None and condition != reference
                    else None
                ),
                "evaluation_share": _mean(shares),
            }
        )
    return table


def markdown(table: list[dict], target: float, reference: str) -> str:
    def fmt(value, spec, suffix=""):
        return "n/a" if value is None else format(value, spec) + suffix

    lines = [
        f"| condition | time to {target:g} per repetition (s) | trimmed mean (s) | median (s) "
        f"| median vs {reference} | first in (rounds vs {reference}) | images to target "
        f"| final val_accuracy | vs {reference} (points) | evaluations' share of training |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        times = ", ".join("not reached" if t is None else f"{t:.1f}" for t in r["times_s"])
        first = f"{r['first_in']}/{r['paired_rounds']}" if r["paired_rounds"] else "-"
        lines.append(
            f"| {r['condition']} | {times} | {fmt(r['trimmed_mean_s'], '.1f')} "
            f"| {fmt(r['median_s'], '.1f')} "
            f"| {fmt(r['median_vs_reference'], '.2f', 'x')} | {first} "
            f"| {fmt(r['images_to_target'], '.0f')} | {fmt(r['final_val_accuracy'], '.4f')} "
            f"| {fmt(r['final_vs_reference_points'], '+.2f')} "
            f"| {fmt(r['evaluation_share'] and 100 * r['evaluation_share'], '.1f', '%')} |"
        )
    return "\n".join(lines)


def plot_curves(
    measurements: list[Measurement], out_dir: Path, title: str, target: float
) -> Path | None:
    """val_accuracy against seconds since the launch, one line per repetition, a colour per
    condition (PNG); None when no measurement has evaluations every few steps."""
    if not any(m.evaluations for m in measurements):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours: dict[str, str] = {}
    for m in measurements:
        if not m.evaluations:
            continue
        labelled = m.condition in colours  # one legend entry per condition
        colour = colours.setdefault(m.condition, f"C{len(colours)}")
        ax.plot(
            [e[0] for e in m.evaluations],
            [e[2] for e in m.evaluations],
            color=colour,
            alpha=0.8,
            label=None if labelled else m.condition,
        )
    ax.axhline(target, color="grey", ls="--", lw=1)
    low = max(0.0, target - 0.15)
    ax.set(
        xlabel="seconds since the launch",
        ylabel="val_accuracy (fixed subset)",
        title=f"{title}: accuracy over time",
        ylim=(low, 1.0),
    )
    ax.legend()
    path = out_dir / "accuracy_over_time.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def trimmed_mean(values: list[float]) -> float | None:
    """MLPerf Training's score of a set of runs: the mean once the fastest and the slowest are
    dropped (from 3 runs on; fewer: the plain mean)."""
    if not values:
        return None
    kept = sorted(values)[1:-1] if len(values) >= 3 else values
    return statistics.mean(kept)


def evaluation_metrics(measurements: list[Measurement]):
    """The interval evaluations as MLflow metrics, ``(key, value, step)``: per condition and
    round, the validation accuracy and the seconds since its launch, at the step of the images
    trained (comparable across conditions whatever their batch)."""
    for m in measurements:
        prefix = f"{m.condition}_r{m.repetition + 1}"
        for seconds, images, accuracy, _took in m.evaluations:
            yield f"{prefix}_interval_val_accuracy", float(accuracy), int(images)
            yield f"{prefix}_interval_seconds", float(seconds), int(images)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None
