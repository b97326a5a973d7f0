"""PNG plots of a run: one figure per metric, one panel per series, one line per server,
the median with a bar from min to max over the rounds."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from arena.metrics import BY_KEY  # noqa: E402

# (file name, title, [metric keys]) - several keys share a panel, told apart by line style.
FIGURES = [
    ("rps.png", "Requests per second", ["rps"]),
    ("latency.png", "Latency percentiles (solid p99, dashed p50)", ["p99_ms", "p50_ms"]),
    ("cpu.png", "Server CPU seconds per 10,000 requests", ["cpu_per_10k"]),
    ("memory.png", "Peak memory of the server process tree (PSS)", ["peak_pss_mib"]),
    # Drawn only when the points have them (the dynamic scenarios).
    ("php-cpu.png", "CPU s per 10,000 requests (solid server + PHP-FPM, dashed PHP-FPM alone)",
     ["total_cpu_per_10k", "php_cpu_per_10k"]),
    ("php-memory.png", "Peak memory of the PHP-FPM pool (PSS)", ["php_peak_pss_mib"]),
]
STYLES = ["-", "--", ":"]


def _series(summary: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for row in summary:
        seen.setdefault(row["series"], None)
    return list(seen)


def plot_metric(results: dict, keys: list[str], title: str, path: Path) -> bool:
    """Draw one figure; False (and no file) if no point has these metrics."""
    summary = results["summary"]
    if not any(k in row["metrics"] for row in summary for k in keys):
        return False
    series = _series(summary)
    servers = results["servers"]
    fig, axes = plt.subplots(1, len(series), figsize=(max(6, 4.5 * len(series)), 4.2), squeeze=False)
    colours = {s: plt.cm.tab10(i % 10) for i, s in enumerate(servers)}
    x_label = results["scenario"].get("x_label", "x")
    for ax, name in zip(axes[0], series):
        xs_all = []
        for server in servers:
            rows = sorted((r for r in summary if r["series"] == name and r["server"] == server),
                          key=lambda r: r["x"])
            labelled = False
            for style, key in zip(STYLES, keys):
                pts = [(r["x"], r["metrics"][key]) for r in rows if key in r["metrics"]]
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                med = [p[1]["median"] for p in pts]
                low = [p[1]["median"] - p[1]["min"] for p in pts]
                high = [p[1]["max"] - p[1]["median"] for p in pts]
                xs_all += xs
                ax.errorbar(xs, med, yerr=[low, high], linestyle=style, marker="o", markersize=4,
                            capsize=3, color=colours[server],
                            # The server's name on its first line drawn (httperf has no p99).
                            label=None if labelled else server)
                labelled = True
        if xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 50:
            ax.set_xscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(x_label)
        metric = BY_KEY[keys[0]]
        ax.set_ylabel(f"{metric.label} ({metric.unit})" if metric.unit else metric.label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{results['scenario']['name']}: {title}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def make_plots(results: dict, folder: Path) -> list[tuple[str, str]]:
    """Write the PNGs into `folder`; return (file name, title) of each one written."""
    made = []
    for name, title, keys in FIGURES:
        if plot_metric(results, keys, title, folder / name):
            made.append((name, title))
    return made
