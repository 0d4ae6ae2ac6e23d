"""``daskgpu bench --plot FILE``: the run's ratios drawn, for those who would rather look.

One horizontal bar per row of the run, its length the ratio daskgpu / baseline
on a log axis (below 1 daskgpu is faster), the goal as a tick where a row has
one, and the line at 1. matplotlib is an optional extra (``daskgpu[plot]``).
"""

from __future__ import annotations

from daskgpu._errors import UsageError


def plot(rows: list, path: str) -> None:
    """Draw ``rows`` (of :func:`~daskgpu._cli.bench.common.ratio`) into the image file ``path``.

    The file's suffix picks the format (``.png``, ``.svg``, ``.pdf``).

    Examples
    --------
    >>> from daskgpu._cli.bench.common import ratio
    >>> rows = [ratio("launch", [2e-6], [4e-6], "us", "numba", goal=0.3, scale=1e6)]
    >>> plot(rows, "ratios.png")  # doctest: +SKIP
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # a file, never a window: runs on headless GPU machines
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("daskgpu bench --plot needs matplotlib: pip install "
                         "\"daskgpu[plot]\" (or pip install matplotlib)") from None
    labels = [f"{r['what'].strip()}\nvs {r['baseline_name']}" for r in rows]
    ratios = [r["ratio"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.5))
    ys = range(len(rows))[::-1]
    colors = ["tab:green" if r <= (row.get("goal") or 1.0) else "tab:red"
              for r, row in zip(ratios, rows)]
    ax.barh(list(ys), ratios, color=colors)
    for y, row in zip(ys, rows):
        if row.get("goal") is not None:
            ax.plot([row["goal"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(list(ys), labels, fontsize=7)
    ax.set_xlabel("daskgpu / baseline (log; below 1 daskgpu is faster; black tick: goal)")
    ax.set_title("daskgpu bench: ratios measured side by side in one run")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
