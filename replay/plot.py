"""Cumulative-accuracy curves of a replay: every permutation, their mean and a ±1σ band (matplotlib)."""

from __future__ import annotations

import io
import math

SIM_CAPTION = "sim backbone: offline simulator — curves show memory dynamics, not clinical accuracy"


def _figure(curves: dict[str, list[float]], title: str, caption: str | None):
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    n = min(len(c) for c in curves.values()) if curves else 0
    xs = list(range(1, n + 1))
    for name, curve in curves.items():
        ax.plot(xs, curve[:n], linewidth=0.8, alpha=0.55, label=name if len(curves) <= 8 else None)
    if n and len(curves) > 1:
        mean = [sum(c[i] for c in curves.values()) / len(curves) for i in range(n)]
        std = [math.sqrt(sum((c[i] - mean[i]) ** 2 for c in curves.values()) / len(curves)) for i in range(n)]
        lo = [min(c[i] for c in curves.values()) for i in range(n)]
        hi = [max(c[i] for c in curves.values()) for i in range(n)]
        ax.fill_between(xs, lo, hi, color="tab:gray", alpha=0.12, linewidth=0, label="min–max")
        ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color="tab:blue", alpha=0.25, linewidth=0, label="mean ± 1σ")
        ax.plot(xs, mean, color="black", linewidth=2.0, label="mean")
    ax.set_xlabel("cases processed")
    ax.set_ylabel("cumulative accuracy")
    ax.set_ylim(0, 1)
    ax.set_xlim(1, max(n, 2))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, 0.03 if caption else 0, 1, 1))
    return fig


def curves_of(result: dict) -> dict[str, list[float]]:
    return {(f"perm {r['k']}" if r["k"] is not None else "original"): r["cumulative_accuracy"]
            for r in result["runs"]}


def title_of(result: dict) -> str:
    return (f"{result['source']}: {result['permutations']} permutations (seed {result['seed']}) · "
            f"{result['policy']} · {result['backbone']} · acc {result['accuracy_mean']:.3f} ± {result['accuracy_std']:.3f}")


def plot_curves(result: dict, path: str | None = None) -> bytes:
    """Draw the replay's curves; writes `path` when given and returns the PNG bytes."""
    import matplotlib.pyplot as plt

    caption = SIM_CAPTION if result.get("backbone") == "sim" else None
    fig = _figure(curves_of(result), title_of(result), caption)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    data = buf.getvalue()
    if path:
        with open(path, "wb") as fh:
            fh.write(data)
    return data


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
