"""Loss curves from one or more runs' `metrics.jsonl`, as in the paper's Fig. 3/4.

Four panels: training and validation loss, each against step and against consumed tokens,
with every run overlaid, and optional reference lines (the quickstart draws the unigram
entropy). A resumed run appends to its metrics file and may repeat steps that were trained
after the last checkpoint; the last record of each step wins, so the curve shows what the
surviving run did.
"""
from __future__ import annotations

from pathlib import Path

from megatron_biglm.training.metrics import read_metrics


def load_run(path) -> dict:
    """{'train': [(step, tokens, loss)], 'valid': [...]} from a run dir or metrics file."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path} (give a run directory or a metrics.jsonl)")
    series = {"train": {}, "valid": {}}
    for rec in read_metrics(path):
        kind = rec.get("kind", "train")
        if kind not in series or "step" not in rec:
            continue
        loss = rec.get("loss")
        if not isinstance(loss, (int, float)):
            continue  # NaN/inf are stored as strings and are not plotted
        series[kind][rec["step"]] = (rec["step"], rec.get("consumed_tokens"), float(loss))
    return {k: [v[s] for s in sorted(v)] for k, v in series.items()}


def plot_runs(runs: dict, out_png, title: str | None = None, reference_lines: dict | None = None) -> Path:
    """Draw {label: run_path} onto one PNG; return its path. `reference_lines` {label: loss}
    adds dashed horizontal lines to every panel (e.g. the corpus's unigram entropy, the
    loss of a model that ignores context)."""
    import matplotlib  # lazy: optional (dev extra, plots only)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: optional (dev extra, plots only)

    loaded = {label: load_run(path) for label, path in runs.items()}
    if not any(r["train"] or r["valid"] for r in loaded.values()):
        raise ValueError(f"no loss records in {list(runs.values())}")
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for (row, kind), (col, xname) in [((r, k), (c, x)) for r, k in enumerate(("train", "valid"))
                                      for c, x in enumerate(("step", "tokens"))]:
        ax = axes[row][col]
        for label, run in loaded.items():
            pts = [(p[0] if xname == "step" else p[1], p[2]) for p in run[kind]]
            pts = [p for p in pts if p[0] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                        marker="o" if kind == "valid" else None, markersize=3)
        for i, (name, value) in enumerate((reference_lines or {}).items()):
            ax.axhline(float(value), linestyle="--", linewidth=1, color=f"C{7 + i}", label=f"{name} {value:.2f}")
        ax.set_xlabel("step" if xname == "step" else "tokens")
        ax.set_ylabel(f"{'training' if kind == 'train' else 'validation'} loss")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
