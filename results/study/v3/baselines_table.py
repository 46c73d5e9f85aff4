"""Prints the study README's table: the family against bilingual baselines.

Reads the ``summary.json`` of two ``m4moe-report --baselines`` reports (the
in-domain test and ``test_ood``) and prints one Markdown row per averaged
language and split: the baseline's BLEU, then each model's seed-mean BLEU
with its ΔBLEU against the baseline, and a last row per split with the mean
ΔBLEU over the languages the report averaged. Nothing is computed here that
the report did not compute; the script only lays its numbers out.

    python3 results/study/v3/baselines_table.py \\
        results/study/v3/confirm/family_s12/baselines_high/report \\
        results/study/v3/confirm/family_s12/baselines_high/report_ood
"""

import json
import pathlib
import sys

BASELINE = "bilingual baselines"


def _signed(value: float) -> str:
    return f"{value:+.2f}".replace("-", "\u2212")


def _rows(summary: dict, split: str) -> list[str]:
    """Table rows of one report: a row per averaged language, then the mean."""
    models = list(summary["num_seeds"])
    languages = summary["intervals"]["languages"]
    rows = []
    for language in summary["averaged"]:
        bleu = languages[language]["bleu"]
        baseline = bleu[BASELINE]["interval"]["score"]
        cells = [f"{language}, {split}", f"{baseline:.2f}"]
        for model in models:
            score = bleu[model]["interval"]["score"]
            delta = _signed(bleu[model]["delta"]["score"])
            cells.append(f"{score:.2f} ({delta})")
        rows.append("| " + " | ".join(cells) + " |")
    means = [_signed(summary["averages"][m]["all"]["delta"]) for m in models]
    count = len(summary["averaged"])
    rows.append(f"| mean \u0394, {split} ({count}) | | "
                + " | ".join(means) + " |")
    return rows


def main(report_dirs: list[str]) -> None:
    if not report_dirs:
        raise SystemExit(
            f"usage: {sys.argv[0]} REPORT_DIR [REPORT_DIR ...]: the "
            "directories that m4moe-report --baselines wrote")
    for report_dir in report_dirs:
        path = pathlib.Path(report_dir) / "summary.json"
        if not path.is_file():
            raise SystemExit(f"{path}: no such file; give a directory "
                             "that m4moe-report --baselines wrote")
        summary = json.loads(path.read_text(encoding="utf-8"))
        print("\n".join(_rows(summary, summary["split"])))


if __name__ == "__main__":
    main(sys.argv[1:])
