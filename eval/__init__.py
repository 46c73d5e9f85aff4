"""m4moe.eval: decoding, scoring and the multilingual-vs-bilingual report.

Modules (one idea each):

* ``translator``: a trained run directory as text in, text out.
* ``textio``: line input of ``m4moe-decode`` (strict UTF-8, language column).
* ``testsets``: a built corpus's test splits and training sizes.
* ``scoring``: per-language sacrebleu BLEU and chrF++ with signatures.
* ``evaluate``: decode every test set and score it.
* ``results``: the per-model evaluation JSON (schema, writing, reading).
* ``examples``: decoded test sentences and the report's examples.
* ``significance``: sacrebleu bootstrap intervals and paired tests.
* ``intervals``: the report's 95% intervals and significance marks.
* ``seeds``: several training seeds of one model, means and spread.
* ``comparison``: multilingual vs bilingual ΔBLEU, ordering, buckets.
* ``dev_ce``: the same comparison on teacher-forced dev cross-entropy.
* ``dev_ranking``: the one rule that ranks candidates on dev scores.
* ``source_reliance``: dev cross-entropy with the source swapped out.
* ``training_logs``: training cost, tokens-to-cross-entropy, router stats.
* ``run_logs``: each scored run (seed) paired with its training log.
* ``smoothing``: LOWESS trendlines for the figure.
* ``figure``: the paper's Figure 6 and router statistics plots.
* ``document``: the report document as Markdown and HTML.
* ``report``: ``report.md``/``report.html`` from the pieces above.
* ``report_sections``: the report's tables as document blocks.
* ``report_intervals``: the report's intervals and significance section.
* ``report_cells``: how the report shows one number or interval.
* ``report_summary``: the report's strict-JSON ``summary.json``.
* ``export``: SavedModel export with a ``translate`` signature.
"""
