"""The Table 5 row: MMLU ZS / FS, SuperGLUE AVG, Genset B-2 / D-2, in the paper's units.

Units as in the paper: MMLU accuracy, SuperGLUE average and BLEU-2 in percent (two decimals),
Distinct-2 as a fraction (two decimals). A section that did not run shows `-`, and a note
under the table says why (never a silently empty cell).
"""
from __future__ import annotations


def mmlu_cell(mmlu: dict) -> str:
    runs = mmlu.get("runs", {})
    if not runs:
        return "-"
    return " / ".join(_pct(runs[k]["accuracy"]) for k in sorted(runs, key=int))


def mmlu_header(mmlu: dict) -> str:
    shots = sorted(mmlu.get("runs", {}), key=int)
    if not shots:
        return "MMLU ZS / FS"
    return "MMLU " + " / ".join("ZS" if int(k) == 0 else f"FS ({k}-shot)" for k in shots)


def format_row(label: str, report: dict) -> str:
    """Markdown header, rule, metric row and the model's row, then one note per skipped or
    partial section."""
    mmlu, sg, gen = report["mmlu"], report["superglue"], report["genset"]
    header = ["Model", mmlu_header(mmlu), "SuperGLUE AVG", "Genset B-2 / D-2"]
    metrics = ["", "acc", "acc (CB: macro-F1)", "BLEU-2 / Distinct-2"]
    cells = [label, mmlu_cell(mmlu),
             _pct(sg["average"]) if "average" in sg else "-",
             f"{_pct(gen['bleu2'])} / {gen['distinct2']:.2f}" if "bleu2" in gen else "-"]
    lines = [_line(header), _line(["---"] * 4), _line(metrics), _line(cells)]
    for name, section in (("MMLU", mmlu), ("SuperGLUE", sg), ("Genset", gen)):
        if "skipped" in section:
            lines.append(f"{name}: skipped ({section['skipped']})")
    if "source" in mmlu and mmlu["source"] != "hub: cais/mmlu":
        lines.append(f"MMLU data: {mmlu['source']}")
    ran = {run.get("subjects") for run in mmlu.get("runs", {}).values() if isinstance(run, dict)} - {None}
    if ran and min(ran) < 57 and not mmlu.get("subjects_only"):
        lines.append(f"MMLU covers {min(ran)} of the 57 subjects (the others had no data): not the "
                     f"paper's average")
    if mmlu.get("subjects_only") or mmlu.get("limit"):
        lines.append(f"MMLU quick run: subjects {', '.join(mmlu.get('subjects_only') or ['all'])}, "
                     f"limit {mmlu.get('limit') or 'none'} per subject (not comparable to the paper)")
    if sg.get("missing"):
        lines.append(f"SuperGLUE AVG over {len(sg['average_over'])} of "
                     f"{len(sg['average_over']) + len(sg['missing'])} tasks "
                     f"({', '.join(sg['average_over'])}); no data for {', '.join(sg['missing'])}")
    return "\n".join(lines)


def _pct(value: float) -> str:
    return f"{100.0 * value:.2f}"


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
