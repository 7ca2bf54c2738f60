"""Accuracy curves of a replay (matplotlib): cumulative and rolling-window, every permutation, their
mean with a ±1σ band, and the memory-free baseline on the same orders when it was replayed."""

from __future__ import annotations

import io
import math

SIM_CAPTION = "sim backbone: offline simulator — curves show memory dynamics, not clinical accuracy"


def _band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    n = min(len(c) for c in curves)
    mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
    std = [math.sqrt(sum((c[i] - mean[i]) ** 2 for c in curves) / len(curves)) for i in range(n)]
    lo = [min(c[i] for c in curves) for i in range(n)]
    hi = [max(c[i] for c in curves) for i in range(n)]
    return mean, std, lo, hi, list(range(1, n + 1))


def _panel(ax, curves: dict[str, list[float]], baseline: list[list[float]] | None, ylabel: str, title: str) -> None:
    n = min(len(c) for c in curves.values()) if curves else 0
    xs = list(range(1, n + 1))
    for name, curve in curves.items():
        ax.plot(xs, curve[:n], linewidth=0.8, alpha=0.55, label=name if len(curves) <= 8 else None)
    if n and len(curves) > 1:
        mean, std, lo, hi, _ = _band(list(curves.values()))
        ax.fill_between(xs, lo, hi, color="tab:gray", alpha=0.12, linewidth=0, label="min–max")
        ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color="tab:blue", alpha=0.25, linewidth=0, label="mean ± 1σ")
        ax.plot(xs, mean, color="black", linewidth=2.0, label="mean")
    if baseline:
        bmean, bstd, _, _, bxs = _band(baseline)
        if len(baseline) > 1:
            ax.fill_between(bxs, [m - s for m, s in zip(bmean, bstd)], [m + s for m, s in zip(bmean, bstd)],
                            color="tab:red", alpha=0.12, linewidth=0)
        ax.plot(bxs, bmean, color="tab:red", linewidth=1.8, linestyle="--", label="baseline (no memory) mean")
    ax.set_xlabel("cases processed")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1)
    ax.set_xlim(1, max(n, 2))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best", ncol=2, framealpha=0.8)


def _figure(result: dict, caption: str | None):
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    rolling = all("rolling_accuracy" in r for r in result["runs"])
    fig, axes = plt.subplots(1, 2 if rolling else 1, figsize=(13 if rolling else 8, 4.6), dpi=110, squeeze=False)
    base = result.get("baseline")
    _panel(axes[0][0], curves_of(result), [r["cumulative_accuracy"] for r in base["runs"]] if base else None,
           "cumulative accuracy", title_of(result))
    if rolling:
        w = result.get("rolling_window")
        _panel(axes[0][1], curves_of(result, "rolling_accuracy"),
               [r["rolling_accuracy"] for r in base["runs"]] if base else None,
               f"accuracy over the last {w} cases", f"rolling window of {w} cases (the same runs)")
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.03 if caption else 0, 1, 1))
    return fig


def curves_of(result: dict, key: str = "cumulative_accuracy") -> dict[str, list[float]]:
    return {(f"perm {r['k']}" if r["k"] is not None else "original"): r[key] for r in result["runs"]}


def title_of(result: dict) -> str:
    ci = result.get("accuracy_ci95")
    interval = f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""
    base = result.get("baseline")
    vs = f"\nbaseline {base['policy']}: {base['accuracy_mean']:.3f} ± {base['accuracy_std']:.3f}" if base else ""
    return (f"{result['source']}: {result['permutations']} permutations (seed {result['seed']}) · "
            f"{result['policy']} · {result['backbone']} · acc {result['accuracy_mean']:.3f} ± "
            f"{result['accuracy_std']:.3f}{interval}{vs}")


def plot_curves(result: dict, path: str | None = None) -> bytes:
    """Draw the replay's curves (cumulative, and rolling beside it when the result has them, with the
    memory-free baseline when replayed); writes `path` when given and returns the PNG bytes."""
    import matplotlib.pyplot as plt

    caption = SIM_CAPTION if result.get("backbone") == "sim" else None
    fig = _figure(result, caption)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    data = buf.getvalue()
    if path:
        atomic_write(path, data)
    return data


def atomic_write(path: str, data: bytes) -> None:
    """Write then rename: an interrupted replay never leaves half a file under the asked name."""
    import os

    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def plot_growth(series: dict[str, dict[str, list[int]]], title: str) -> bytes:
    """Memory size over the stream (active rules, episodes) for each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    for name, s in series.items():
        xs = list(range(1, len(s["rules"]) + 1))
        ax.plot(xs, s["rules"], linewidth=0.9, alpha=0.7, label=f"{name} rules")
        ax.plot(xs, s["episodes"], linewidth=0.9, alpha=0.5, linestyle="--",
                label=f"{name} episodes" if len(series) <= 3 else None)
    ax.set_xlabel("cases processed")
    ax.set_ylabel("items in memory")
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    if len(series) <= 4:
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
