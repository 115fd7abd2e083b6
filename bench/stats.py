"""The paper's statistics and figures: a table of epoch times, ANOVA, Tukey HSD, scaling plots."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from bench.conditions import Measurement


def _order(measurements: list[Measurement]) -> list[str]:
    seen = {m.condition: m.np for m in measurements}
    return sorted(seen, key=lambda c: seen[c])


def epoch_samples(measurements: list[Measurement]) -> dict[str, list[float]]:
    """Every epoch time (callback method) of every repetition, per condition."""
    samples: dict[str, list[float]] = defaultdict(list)
    for m in measurements:
        samples[m.condition].extend(m.epoch_times)
    return dict(samples)


def anova(measurements: list[Measurement]) -> tuple[float, float] | None:
    """One-way ANOVA on epoch times across conditions: (F, p), or None if it cannot be run."""
    from scipy.stats import f_oneway

    groups = [g for g in epoch_samples(measurements).values() if len(g) >= 2]
    if len(groups) < 2:
        return None
    result = f_oneway(*groups)
    return float(result.statistic), float(result.pvalue)


def tukey_against_np1(measurements: list[Measurement]) -> dict[str, float]:
    """Tukey HSD p-value of each condition's epoch times against np=1's."""
    from scipy.stats import tukey_hsd

    samples = epoch_samples(measurements)
    names = [c for c in _order(measurements) if len(samples[c]) >= 2]
    if "np=1" not in names or len(names) < 2:
        return {}
    result = tukey_hsd(*[samples[c] for c in names])
    reference = names.index("np=1")
    return {c: float(result.pvalue[i][reference]) for i, c in enumerate(names) if c != "np=1"}


def summary_table(measurements: list[Measurement]) -> list[dict]:
    """One row per condition, shaped like the paper's tables."""
    samples = epoch_samples(measurements)
    tukey = tukey_against_np1(measurements)
    by_condition: dict[str, list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_condition[m.condition].append(m)
    np1 = by_condition.get("np=1")
    np1_rate = statistics.mean(m.images_per_s for m in np1) if np1 else None
    rows = []
    for condition in _order(measurements):
        group = by_condition[condition]
        times = samples[condition]
        log_times = [t for m in group for t in m.epoch_times_log]
        rate = statistics.mean(m.images_per_s for m in group)
        np = group[0].np
        rows.append(
            {
                "condition": condition,
                "np": np,
                "epoch_time_mean_s": statistics.mean(times),
                "epoch_time_std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
                "epoch_time_log_mean_s": statistics.mean(log_times) if log_times else None,
                "tukey_p_vs_np1": tukey.get(condition),
                "images_per_s": rate,
                "images_per_s_epoch": statistics.mean(
                    r for m in group for r in m.images_per_s_epoch
                ),
                "scaling_efficiency": rate / (np * np1_rate) if np1_rate and np >= 1 else None,
                "repetitions": len(group),
            }
        )
    return rows


def markdown(rows: list[dict], anova_result: tuple[float, float] | None) -> str:
    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)

    lines = [
        "| condition | epoch time mean ± std (s) | log-method epoch (s) | Tukey p vs np=1 "
        "| images/s | images/s per epoch | scaling efficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['condition']} | {r['epoch_time_mean_s']:.3f} ± {r['epoch_time_std_s']:.3f} "
            f"| {fmt(r['epoch_time_log_mean_s'], '.3f')} | {fmt(r['tukey_p_vs_np1'], '.3g')} "
            f"| {r['images_per_s']:.1f} | {r['images_per_s_epoch']:.1f} "
            f"| {fmt(r['scaling_efficiency'] and 100 * r['scaling_efficiency'], '.1f')}"
            f"{'%' if r['scaling_efficiency'] is not None else ''} |"
        )
    if anova_result:
        lines.append(
            f"\nOne-way ANOVA on epoch times: F = {anova_result[0]:.3g}, p = {anova_result[1]:.3g}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], out_dir: Path, title: str) -> list[Path]:
    """images/s against np, and scaling efficiency against np (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = [r for r in rows if r["np"] >= 1]
    baseline = next((r for r in rows if r["np"] == 0), None)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [r["np"] for r in ranks], [r["images_per_s"] for r in ranks], "o-", label="HorovodRunner"
    )
    if baseline:
        ax.axhline(baseline["images_per_s"], color="grey", ls="--", label="plain Keras")
    ax.set(xlabel="np (ranks)", ylabel="images/s", title=f"{title}: throughput")
    ax.set_xticks([r["np"] for r in ranks])
    ax.legend()
    paths.append(out_dir / "images_per_s.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    efficiency = [r for r in ranks if r["scaling_efficiency"] is not None]
    ax.plot(
        [r["np"] for r in efficiency], [100 * r["scaling_efficiency"] for r in efficiency], "o-"
    )
    ax.axhline(100, color="grey", ls="--", label="linear scaling")
    ax.set(xlabel="np (ranks)", ylabel="scaling efficiency (%)", title=f"{title}: scaling")
    ax.set_xticks([r["np"] for r in efficiency] or [1])
    ax.set_ylim(0, 120)
    ax.legend()
    paths.append(out_dir / "scaling_efficiency.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
