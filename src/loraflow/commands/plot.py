"""`loraflow plot`: the curves of one or more runs (metrics.jsonl) as PNG files, runs overlaid and named.

One PNG per metric: train loss, learning rate, gradient norm, every other numeric train metric (RL stages log
`reward`, `kl`, ...) and every numeric eval metric (loss, exact_match, reward, reward/NAME, gold/NAME).
"""

from __future__ import annotations

from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.loop.metrics import read_metrics

# Bookkeeping and throughput, not learning curves.
SKIPPED = {"kind", "step", "time", "tokens", "tokens_per_s"}
# The train curves everyone looks for first, in this order; the rest follow alphabetically.
FIRST = ("loss", "lr", "grad_norm")
TITLES = {"lr": "learning rate", "grad_norm": "gradient norm (before clipping)"}

Series = dict[str, dict[int, float]]
"""run name -> step -> value (the last row logged for a step wins, as after a resumed run replays it)."""


def _run_names(run_dirs: list[Path]) -> list[str]:
    names = [p.resolve().name for p in run_dirs]
    # Two runs of the same name (a/run, b/run) are told apart by their paths.
    return [str(p) if names.count(n) > 1 else n for p, n in zip(run_dirs, names)]


def collect(run_dirs: list[Path]) -> dict[tuple[str, str], Series]:
    """(kind, metric) -> the series of each run that logged it."""
    curves: dict[tuple[str, str], Series] = {}
    for run, name in zip(run_dirs, _run_names(run_dirs)):
        if not run.is_dir():
            raise LoraflowError(f"{run}: no such run directory.")
        if not (run / "metrics.jsonl").is_file():
            raise LoraflowError(f"{run} has no metrics.jsonl: it is not a loraflow run directory, or the run stopped "
                                "before logging anything. Pass the directory `loraflow train` printed.")
        for row in read_metrics(run):
            if row.get("kind") not in ("train", "eval"):
                continue  # memory rows are one-off reports, not curves
            for key, value in row.items():
                if key in SKIPPED or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                curves.setdefault((row["kind"], key), {}).setdefault(name, {})[int(row["step"])] = float(value)
    if not curves:
        raise LoraflowError(f"{', '.join(map(str, run_dirs))}: metrics.jsonl holds no train or eval rows yet.")
    return curves


def _order(item: tuple[str, str]) -> tuple[int, int, str]:
    kind, key = item
    return (0 if kind == "train" else 1, FIRST.index(key) if kind == "train" and key in FIRST else len(FIRST), key)


def _file_name(kind: str, key: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return f"{kind}-{safe}.png"


def plot_runs(run_dirs: list[str], out_dir: str | None = None) -> list[Path]:
    """Write the PNGs and return their paths. One run: RUN/plots/ by default; several: `out_dir` is required."""
    runs = [Path(r) for r in run_dirs]
    if len(runs) > 1 and out_dir is None:
        raise LoraflowError(f"plotting {len(runs)} runs together: say where the PNGs go with -o OUT_DIR.")
    curves = collect(runs)
    try:
        import matplotlib
    except ImportError:
        from loraflow.environment import install_line

        raise LoraflowError(f"loraflow plot needs matplotlib, which is not installed here: "
                            f"{install_line('matplotlib')}") from None
    matplotlib.use("Agg")  # files only: no display needed (servers, CI)
    import matplotlib.pyplot as plt

    out = Path(out_dir) if out_dir is not None else runs[0] / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, key in sorted(curves, key=_order):
        fig, ax = plt.subplots(figsize=(7, 4))
        values = []
        for name, points in curves[(kind, key)].items():
            steps = sorted(points)
            ys = [points[s] for s in steps]
            values += ys
            # Markers when points are few (eval every N steps), so a single eval point is still visible.
            ax.plot(steps, ys, label=name, marker="o" if len(steps) <= 30 else None)
        if "loss" in key and values and min(values) > 0 and max(values) / min(values) > 100:
            ax.set_yscale("log")  # losses fall by orders of magnitude; linear would flatten all but the start
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(f"{kind}: {TITLES.get(key, key)}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / _file_name(kind, key)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
