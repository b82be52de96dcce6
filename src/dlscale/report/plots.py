"""matplotlib figures as PNG bytes (Agg backend: no display, no network)."""

from __future__ import annotations

import io
from collections.abc import Sequence

PALETTE = ("#1f5f8b", "#e07b39", "#3a9d5d", "#b8433f", "#7d5ba6", "#8c6d3f", "#4c9db0", "#999999")


def _fig(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=110)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x" if width > height else "y", alpha=0.3)
    return fig, ax


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def hbars(labels: Sequence[str], values: Sequence[float], errors: Sequence[tuple[float, float] | None],
          colors: Sequence[int], legend: Sequence[str], xlabel: str, title: str) -> bytes:
    """Horizontal bars, one per row, with 95% CI whiskers where known; colour = legend index."""
    fig, ax = _fig(7.5, max(2.2, 0.38 * len(labels) + 1.2))
    ys = list(range(len(labels)))[::-1]
    lo = [v - e[0] if e else 0 for v, e in zip(values, errors)]
    hi = [e[1] - v if e else 0 for v, e in zip(values, errors)]
    ax.barh(ys, values, color=[PALETTE[c % len(PALETTE)] for c in colors], xerr=[lo, hi],
            error_kw={"elinewidth": 1, "capsize": 2, "ecolor": "#333"})
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10, loc="left")
    if len(legend) > 1:
        import matplotlib.patches as mpatches

        ax.legend(handles=[mpatches.Patch(color=PALETTE[i % len(PALETTE)], label=s) for i, s in enumerate(legend)],
                  fontsize=7, loc="lower right")
    return _png(fig)


def scaling(series: dict[str, tuple[list[int], list[float], list[float]]], title: str,
            ylabel: str = "throughput (samples/s)") -> bytes:
    """Measured throughput against ideal (N x single-device) per ladder, on devices (one unit per axis)."""
    fig, ax = _fig(6.5, 3.8)
    for i, (name, (ns, measured, ideal)) in enumerate(series.items()):
        c = PALETTE[i % len(PALETTE)]
        ax.plot(ns, measured, "o-", color=c, label=f"{name}")
        ax.plot(ns, ideal, "--", color=c, alpha=0.5, label=f"{name} ideal")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("devices")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(fontsize=7)
    return _png(fig)


def predicted(points: list[tuple[str, float, float]], title: str) -> bytes:
    """Predicted against measured (one point per layout, labelled), with the line of no error."""
    fig, ax = _fig(6.5, 4.2)
    top = max([1.0, *(max(m, p) for _, m, p in points)]) * 1.05
    ax.plot([0, top], [0, top], "--", color="#888888", linewidth=1, label="prediction = measurement")
    for i, (label, measured, pred) in enumerate(points):
        ax.plot([measured], [pred], "o", color=PALETTE[i % len(PALETTE)], label=label)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured scaling efficiency")
    ax.set_ylabel("predicted scaling efficiency")
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(fontsize=6, loc="lower right")
    return _png(fig)


def lines(series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str, title: str) -> bytes:
    """Plain x-y lines (time-to-accuracy curves, monitoring time series)."""
    fig, ax = _fig(6.5, 3.6)
    for i, (name, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, "-", color=PALETTE[i % len(PALETTE)], label=name, linewidth=1.4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, loc="left")
    if len(series) > 1:
        ax.legend(fontsize=7)
    return _png(fig)


def speedups(series: dict[str, tuple[list[int], list[float]]], title: str) -> bytes:
    """Speed-up over each domain's smallest device count against device count, with ideal (N / n0) lines.

    Speed-ups are ratios of one domain's own figures, so domains of different sample units can
    share this axis (their throughputs never do).
    """
    fig, ax = _fig(6.5, 3.8)
    for i, (name, (ns, ups)) in enumerate(series.items()):
        c = PALETTE[i % len(PALETTE)]
        ax.plot(ns, ups, "o-", color=c, label=name)
        ax.plot(ns, [n / ns[0] for n in ns], ":", color=c, alpha=0.5)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("devices")
    ax.set_ylabel("speed-up over the smallest device count")
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(fontsize=7)
    return _png(fig)


STATUS_COLORS = {"PASS": "#3a9d5d", "WARN": "#e0a339", "FAIL": "#b8433f", "ERROR": "#8e3b8e",
                 "NO EXPECTATION": "#999999"}


def history(series: dict[str, tuple[list[int], list[float], list[str]]], ticks: list[str], ylabel: str,
            title: str) -> bytes:
    """Each figure of a check over successive acceptances (x: the acceptance's position, labelled by
    ``ticks``), a line per figure, each point coloured by that acceptance's verdict."""
    fig, ax = _fig(6.5, 3.6)
    for i, (name, (xs, ys, statuses)) in enumerate(series.items()):
        c = PALETTE[i % len(PALETTE)]
        ax.plot(xs, ys, "-", color=c, label=name, linewidth=1.2, alpha=0.8)
        ax.scatter(xs, ys, c=[STATUS_COLORS.get(s, "#333333") for s in statuses], s=22, zorder=3)
    ax.set_xticks(range(len(ticks)), ticks, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title + "  (points: green PASS, amber WARN, red FAIL, grey no expectation)", fontsize=9, loc="left")
    if 1 < len(series) <= 12:
        ax.legend(fontsize=6)
    return _png(fig)


def pareto(series: dict[str, tuple[list[float], list[float], list[str], list[bool]]], xlabel: str, ylabel: str,
           title: str) -> bytes:
    """Per series its points (x, y) labelled, and the points on its Pareto front joined by a line."""
    fig, ax = _fig(6.5, 4.0)
    for i, (name, (xs, ys, labels, front)) in enumerate(series.items()):
        c = PALETTE[i % len(PALETTE)]
        ax.plot(xs, ys, "o", color=c, alpha=0.45, label=name)
        on = sorted((x, y) for x, y, f in zip(xs, ys, front) if f)
        ax.plot([p[0] for p in on], [p[1] for p in on], "o-", color=c, linewidth=1.4)
        for x, y, lab in zip(xs, ys, labels):
            ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7, color=c)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(fontsize=7)
    return _png(fig)
