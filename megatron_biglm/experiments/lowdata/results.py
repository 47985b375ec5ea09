"""The sweep's results file (CSV, one row per finished cell, appended as cells finish) and
what is drawn from it: mean ± std curves per paradigm (a PNG per task) and the IPR table.

IPR pairs (“Scaling Effects of Instruction Tuning” Table 2 is instruct vs prompted): `instruct/prompted` over N incl. 0,
`prompted/head` and `instruct/head` over the head's Ns (N > 0); see `metrics.ipr` for the
N = 0 rule. Per task: the mean ± std over seeds of the per-seed IPR, in percent. A pair whose curves share
fewer than two N values has no integral and is left out of the table.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from megatron_biglm.finetune.metrics.ipr import ipr_over_seeds

from .grid import Cell

FIELDS = ("task", "paradigm", "n", "seed", "score", "metric", "seconds")
IPR_PAIRS = (("instruct", "prompted"), ("prompted", "head"), ("instruct", "head"))


def read_results(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["n"], row["seed"], row["score"] = int(row["n"]), int(row["seed"]), float(row["score"])
    return rows


def finished(path) -> set:
    return {(r["task"], r["paradigm"], r["n"], r["seed"]) for r in read_results(path)}


def append_result(path, cell: Cell, score: float, metric: str, seconds: float) -> None:
    path = Path(path)
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({"task": cell.task, "paradigm": cell.paradigm, "n": cell.n, "seed": cell.seed,
                         "score": repr(float(score)), "metric": metric, "seconds": f"{seconds:.2f}"})


def curves(rows) -> dict:
    """{task: {paradigm: {seed: {n: score}}}}."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        out[r["task"]][r["paradigm"]][r["seed"]][r["n"]] = r["score"]
    return out


def ipr_table(rows) -> list[dict]:
    """One row per task and pair with both paradigms present, plus an `average` row per pair
    (mean ± std of the task means, as Table 2's Average column)."""
    table = []
    for task, by_paradigm in sorted(curves(rows).items()):
        for f, g in IPR_PAIRS:
            if f not in by_paradigm or g not in by_paradigm:
                continue
            seeds = sorted(set(by_paradigm[f]) & set(by_paradigm[g]))
            if len(set.intersection(*(set(by_paradigm[p][s]) for p in (f, g) for s in seeds))) < 2:
                continue  # fewer than two common N (e.g. head with one N > 0): no integral
            out = ipr_over_seeds([by_paradigm[f][s] for s in seeds], [by_paradigm[g][s] for s in seeds])
            table.append({"task": task, "pair": f"{f}/{g}", "ipr_mean_pct": 100 * out["mean"],
                          "ipr_std_pct": 100 * out["std"], "seeds": len(seeds),
                          "n_from": out["n_range"][0], "n_to": out["n_range"][1]})
    for pair in dict.fromkeys(r["pair"] for r in table):
        means = [r["ipr_mean_pct"] for r in table if r["pair"] == pair]
        table.append({"task": "average", "pair": pair, "ipr_mean_pct": float(np.mean(means)),
                      "ipr_std_pct": float(np.std(means, ddof=1)) if len(means) > 1 else 0.0,
                      "seeds": "", "n_from": "", "n_to": ""})
    return table


def write_ipr_table(table, csv_path, markdown_path) -> None:
    fields = ("task", "pair", "ipr_mean_pct", "ipr_std_pct", "seeds", "n_from", "n_to")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(table)
    lines = ["| task | IPR | mean ± std (%) | N range |", "|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['pair']} | {r['ipr_mean_pct']:.1f} ± {r['ipr_std_pct']:.1f} | "
              f"{r['n_from']}–{r['n_to']} |" if r["task"] != "average" else
              f"| average | {r['pair']} | {r['ipr_mean_pct']:.1f} ± {r['ipr_std_pct']:.1f} | |" for r in table]
    Path(markdown_path).write_text("\n".join(lines) + "\n")


def plot_task(task: str, by_paradigm: dict, path, metric: str = "score") -> None:
    """Mean ± std (over seeds) of each paradigm's score against N (symlog x: N = 0 shows)."""
    import matplotlib  # lazy: optional (dev extra, plots only)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: optional (dev extra, plots only)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for paradigm, seeds in sorted(by_paradigm.items()):
        ns = sorted(set.intersection(*(set(c) for c in seeds.values())))
        scores = np.array([[seeds[s][n] for n in ns] for s in sorted(seeds)])
        mean, std = scores.mean(0), scores.std(0, ddof=1) if len(scores) > 1 else np.zeros(len(ns))
        ax.plot(ns, mean, marker="o", label=paradigm)
        ax.fill_between(ns, mean - std, mean + std, alpha=0.2)
    ax.set_xscale("symlog", linthresh=8)
    ax.set_xlabel("training examples N")
    ax.set_ylabel(metric)
    ax.set_title(task)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
