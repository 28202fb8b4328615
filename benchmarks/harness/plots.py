"""Plots of the workload benchmarks (matplotlib, no display needed): latency against offered
rate per system (mean and P99), and the longest prompt each configuration fits."""

from __future__ import annotations

from pathlib import Path

STYLE = {  # stock dashed, ours solid; the full system stands out
    "ours": dict(color="tab:red", linewidth=2.5, marker="o"),
    "ours-no-jct": dict(color="tab:orange", marker="s"),
    "ours-no-hybrid": dict(color="tab:pink", marker="^"),
    "ours-no-kv": dict(color="tab:purple", marker="v"),
    "ours-no-attention": dict(color="tab:brown", marker="D"),
    "stock-fcfs": dict(color="tab:blue", linestyle="--", marker="o"),
    "stock-lpm": dict(color="tab:cyan", linestyle="--", marker="s"),
    "stock-spf": dict(color="tab:green", linestyle="--", marker="^"),
    "stock-hrrn": dict(color="tab:olive", linestyle="--", marker="v"),
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_curves(rows: list[dict], title: str, p99_bounds, out: Path) -> Path:
    """rows: one per (system, rate) with keys system, rate, mean, p99, completed, requests.
    A run with unfinished requests is drawn as a hollow marker at its measured value."""
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    for ax, metric in zip(axes, ("mean", "p99")):
        for system in dict.fromkeys(r["system"] for r in rows):
            mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["rate"])
            style = STYLE.get(system, {})
            ax.plot([r["rate"] for r in mine], [r[metric] for r in mine], label=system, **style)
            cut = [r for r in mine if r["completed"] < r["requests"]]
            ax.scatter([r["rate"] for r in cut], [r[metric] for r in cut], s=90,
                       facecolors="none", edgecolors="black", zorder=5)  # fmt: skip
        if metric == "p99":
            for bound in p99_bounds:
                ax.axhline(bound, color="gray", linestyle=":", label=f"P99 bound {bound:g} s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers, not 2 x 10^0
            axis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_xticks(sorted({r["rate"] for r in rows}))  # the rates measured
        ax.set_xlabel("offered load (requests/s, Poisson)")
        ax.set_ylabel(f"{'mean' if metric == 'mean' else 'P99'} latency (s)")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{title} (hollow: some requests unfinished at the deadline)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def max_prompt_bars(longest: dict[str, float], title: str, out: Path) -> Path:
    """longest: configuration -> the longest prompt (tokens) it fits."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = list(longest)
    bars = ax.barh(names, [longest[n] for n in names], color="tab:gray")
    for bar, name in zip(bars, names):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {longest[name]:,.0f}",
                va="center", fontsize=9)  # fmt: skip
    ax.set_xlim(0, max(longest.values()) * 1.18)  # room for the labels
    ax.set_xlabel("longest prompt (tokens)")
    ax.set_title(title, fontsize=10)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
