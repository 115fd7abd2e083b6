"""The paper's statistics and figures, on steady-state measures.

Every figure is per repetition first, then over repetitions: a repetition is one independent run
of a condition, and its epochs are not independent samples (they share the process and data).

- steady-state epoch time and images/s: the mean over a repetition's epochs after the first,
  then mean ± std over repetitions; the first epoch is reported on its own as warm-up;
- ANOVA and Tukey HSD: on the per-repetition steady epoch means, and times to target;
- time to target (MLPerf Training's measure): wall clock from the launch to the first evaluation
  that reached it; a condition with a repetition that never reached it has no time (n/a);
- scaling efficiency of N ranks: images/s(N) / (N x images/s(1 rank of the same engine)), the
  same thread budget per rank; ``ceilingN`` is that ratio for processes that exchange nothing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from hvdflow.bench.conditions import CEILING, HOROVOD, KERAS, TF, Measurement

REFERENCE = "hvd1"
# Where Horovod is not installed (the current profile), one rank of TensorFlow's collectives.
REFERENCE_WITHOUT_HOROVOD = "tf1"


def reference_of(measurements: list[Measurement]) -> str:
    """The condition the others are tested against: np=1 with Horovod, else with TensorFlow's
    collectives where the study has no Horovod condition."""
    names = {m.condition for m in measurements}
    if REFERENCE not in names and REFERENCE_WITHOUT_HOROVOD in names:
        return REFERENCE_WITHOUT_HOROVOD
    return REFERENCE


_KIND_ORDER = {KERAS: 0, CEILING: 1, HOROVOD: 2, TF: 3}


def order(measurements: list[Measurement]) -> list[str]:
    first = {}
    for m in measurements:
        first.setdefault(m.condition, (_KIND_ORDER.get(m.kind, 9), m.processes, m.threads))
    return sorted(first, key=lambda c: (first[c], c))


def repetition_means(measurements: list[Measurement]) -> dict[str, list[float]]:
    """Each repetition's steady-state epoch time, per condition."""
    samples: dict[str, list[float]] = defaultdict(list)
    for m in measurements:
        samples[m.condition].append(statistics.mean(m.steady_epoch_times))
    return dict(samples)


def times_to_target(measurements: list[Measurement], target: float) -> dict[str, list[float]]:
    """Each repetition's time to ``target``, per condition whose repetitions all reached it."""
    samples: dict[str, list[float | None]] = defaultdict(list)
    for m in measurements:
        samples[m.condition].append(m.seconds_to(target))
    return {c: v for c, v in samples.items() if None not in v}


def anova(
    measurements: list[Measurement], samples: dict[str, list[float]] | None = None
) -> tuple[float, float] | None:
    """One-way ANOVA on per-repetition values (default: steady epoch times): (F, p), or None
    if it cannot run."""
    from scipy.stats import f_oneway

    samples = repetition_means(measurements) if samples is None else samples
    groups = [g for g in samples.values() if len(g) >= 2]
    if len(groups) < 2:
        return None
    result = f_oneway(*groups)
    return float(result.statistic), float(result.pvalue)


def tukey_against(
    measurements: list[Measurement],
    reference: str | None = None,
    samples: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Tukey HSD p-value of each condition's per-repetition values (default: steady epoch
    times) against ``reference``'s (default: ``reference_of``)."""
    from scipy.stats import tukey_hsd

    reference = reference or reference_of(measurements)
    samples = repetition_means(measurements) if samples is None else samples
    names = [c for c in order(measurements) if len(samples.get(c, [])) >= 2]
    if reference not in names or len(names) < 2:
        return {}
    result = tukey_hsd(*[samples[c] for c in names])
    ref = names.index(reference)
    return {c: float(result.pvalue[i][ref]) for i, c in enumerate(names) if c != reference}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summary_table(
    measurements: list[Measurement], reference: str | None = None, target: float | None = None
) -> list[dict]:
    """One row per condition, shaped like the paper's tables, steady state first; with a
    ``target`` accuracy, the time to reach it last."""
    reference = reference or reference_of(measurements)
    groups: dict[str, list[Measurement]] = defaultdict(list)
    for m in measurements:
        groups[m.condition].append(m)
    rate = {c: statistics.mean(m.steady_images_per_s for m in g) for c, g in groups.items()}
    tukey = tukey_against(measurements, reference)
    to_target = times_to_target(measurements, target) if target is not None else {}
    tukey_target = tukey_against(measurements, reference, to_target) if to_target else {}
    rows = []
    for condition in order(measurements):
        group = groups[condition]
        first = group[0]
        epoch_mean, epoch_std = _mean_std([statistics.mean(m.steady_epoch_times) for m in group])
        rate_mean, rate_std = _mean_std([m.steady_images_per_s for m in group])
        rows.append(
            {
                "condition": condition,
                "kind": first.kind,
                "np": first.np,
                "processes": first.processes,
                "threads": first.threads,
                "warmup_s": statistics.mean(m.warmup_s for m in group),
                "epoch_time_mean_s": epoch_mean,
                "epoch_time_std_s": epoch_std,
                "epoch_time_log_mean_s": _mean_or_none(
                    [t for m in group for t in m.epoch_times_log[1:]]
                ),
                "tukey_p": tukey.get(condition),
                "images_per_s": rate_mean,
                "images_per_s_std": rate_std,
                "wall_images_per_s": statistics.mean(m.images_per_s for m in group),
                "launch_s": statistics.mean(m.launch_s for m in group),
                "scaling_efficiency": scaling_efficiency(first, rate),
                "of_ceiling": _ratio(rate, condition, f"ceiling{first.np}", first.np >= 1),
                "vs_keras": _ratio(rate, condition, KERAS, first.np >= 1),
                "vs_keras1": _ratio(rate, condition, "keras1", first.np == 1),
                "repetitions": len(group),
                "val_accuracy": _mean_or_none(
                    [m.final_val_accuracy for m in group if m.final_val_accuracy is not None]
                ),
                "target_accuracy": target,
                "reached_target": sum(
                    target is not None and m.seconds_to(target) is not None for m in group
                ),
                "time_to_target_s": _mean_or_none(to_target.get(condition, [])),
                "time_to_target_std_s": _std_or_none(to_target.get(condition, [])),
                "tukey_p_time_to_target": tukey_target.get(condition),
                "time_to_target_vs_hvd1": _ratio(
                    {c: statistics.mean(v) for c, v in to_target.items()},
                    condition,
                    reference,
                    condition in to_target,
                ),
            }
        )
    return rows


def scaling_efficiency(m: Measurement, rate: dict[str, float]) -> float | None:
    """images/s over N times one process of the same kind and thread budget (ranks against one
    rank of their engine, else Horovod's; a ceiling against ``keras<threads>``)."""
    if m.kind == CEILING:
        one = rate.get(f"keras{m.threads}")
    elif m.kind in (HOROVOD, TF):
        one = rate.get(f"{m.kind}1") or rate.get(REFERENCE)
    else:
        return None
    if not one:
        return None
    return rate[m.condition] / (m.processes * one)


def _ratio(rate: dict[str, float], condition: str, other: str, applies: bool) -> float | None:
    if not applies or other not in rate or other == condition:
        return None
    return rate[condition] / rate[other]


def _mean_or_none(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None


def _std_or_none(values: list[float]) -> float | None:
    return _mean_std(values)[1] if values else None


def markdown(
    rows: list[dict],
    anova_result: tuple[float, float] | None,
    anova_time_to_target: tuple[float, float] | None = None,
    reference: str = REFERENCE,
) -> str:
    def fmt(value, spec, suffix=""):
        return "n/a" if value is None else format(value, spec) + suffix

    def pct(value):
        return fmt(value and 100 * value, ".1f", "%") if value is not None else "n/a"

    lines = [
        "| condition | processes x threads | warm-up epoch (s) | steady epoch mean ± std (s) "
        f"| Tukey p vs {reference} | steady images/s | scaling efficiency | of machine ceiling "
        "| vs Keras (all cores) | launch overhead (s) | wall-clock images/s "
        f"| final val_accuracy | time to target ± std (s) | Tukey p (time) | time vs {reference} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        threads = r["threads"] or ("all" if r["processes"] == 1 else "shared")
        if r.get("time_to_target_s") is not None:
            to_target = f"{r['time_to_target_s']:.1f} ± {r['time_to_target_std_s']:.1f}"
        elif r.get("target_accuracy") is not None:
            to_target = f"not reached ({r['reached_target']}/{r['repetitions']})"
        else:
            to_target = "n/a"
        lines.append(
            f"| {r['condition']} | {r['processes']} x {threads} | {r['warmup_s']:.2f} "
            f"| {r['epoch_time_mean_s']:.3f} ± {r['epoch_time_std_s']:.3f} "
            f"| {fmt(r['tukey_p'], '.3g')} "
            f"| {r['images_per_s']:.1f} ± {r['images_per_s_std']:.1f} "
            f"| {pct(r['scaling_efficiency'])} | {pct(r['of_ceiling'])} | {pct(r['vs_keras'])} "
            f"| {r['launch_s']:.1f} | {r['wall_images_per_s']:.1f} "
            f"| {fmt(r.get('val_accuracy'), '.4f')} | {to_target} "
            f"| {fmt(r.get('tukey_p_time_to_target'), '.3g')} "
            f"| {fmt(r.get('time_to_target_vs_hvd1'), '.2f', 'x')} |"
        )
    if anova_result:
        lines.append(
            f"\nOne-way ANOVA on the per-repetition steady epoch times: F = {anova_result[0]:.3g}"
            f", p = {anova_result[1]:.3g}"
        )
    if anova_time_to_target:
        target = next((r["target_accuracy"] for r in rows), None)
        lines.append(
            f"\nOne-way ANOVA on the per-repetition times to val_accuracy {target}: "
            f"F = {anova_time_to_target[0]:.3g}, p = {anova_time_to_target[1]:.3g}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], out_dir: Path, title: str) -> list[Path]:
    """Steady-state images/s per condition, and scaling efficiency per condition (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    colours = {KERAS: "grey", CEILING: "black", HOROVOD: "tab:blue", TF: "tab:orange"}
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["condition"] for r in rows]
    ax.bar(
        names,
        [r["images_per_s"] for r in rows],
        yerr=[r["images_per_s_std"] for r in rows],
        color=[colours.get(r["kind"], "tab:green") for r in rows],
    )
    ax.set(ylabel="images/s (steady state)", title=f"{title}: throughput")
    paths.append(out_dir / "images_per_s.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    scaled = [r for r in rows if r["scaling_efficiency"] is not None]
    ax.bar(
        [r["condition"] for r in scaled],
        [100 * r["scaling_efficiency"] for r in scaled],
        color=[colours.get(r["kind"], "tab:green") for r in scaled],
    )
    ax.axhline(100, color="grey", ls="--", label="linear scaling")
    ax.set(ylabel="scaling efficiency (%)", title=f"{title}: scaling", ylim=(0, 120))
    ax.legend()
    paths.append(out_dir / "scaling_efficiency.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    target = next((r.get("target_accuracy") for r in rows), None)
    if target is None:
        return paths
    fig, ax = plt.subplots(figsize=(7, 4))
    reached = [r for r in rows if r.get("time_to_target_s") is not None]
    ax.bar(
        [r["condition"] for r in reached],
        [r["time_to_target_s"] for r in reached],
        yerr=[r["time_to_target_std_s"] for r in reached],
        color=[colours.get(r["kind"], "tab:green") for r in reached],
    )
    missed = [r["condition"] for r in rows if r.get("time_to_target_s") is None]
    note = f" (not reached: {', '.join(missed)})" if missed else ""
    ax.set(
        ylabel=f"seconds to val_accuracy {target:g}, launch included",
        title=f"{title}: time to accuracy{note}",
    )
    paths.append(out_dir / "time_to_target.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
