"""m4moe.data: the offline multilingual corpus, vocabularies and input pipeline.

Modules (one idea each):

* ``languages``: locale normalisation (``pt_BR`` -> ``pt``) and scripts.
* ``subtags``: the script, region and variant subtags a locale may carry.
* ``iso639``: the ISO 639 codes the corpus accepts as languages (and a
  catalog's language may carry).
* ``catalogs``: ``.po``/``.mo`` parsing with polib, plural forms.
* ``cleaning``: per-pair cleaning rules, each counted.
* ``licenses``: the corpus's source packages' licences, as a generated page.
* ``sources``: recipe pins, cached ``apt-get``/``pip`` downloads, extraction.
* ``corpus``: the build (dedup, split, atomic output, ``report.json``).
* ``corpus_coverage``: what a build left out of its recipe, said where the
  user looks.
* ``worker_pool``: catalog-parsing workers that die with the builder.
* ``split``: leak-free dev/test by English near-duplicate group, frozen keys.
* ``sampling``: temperature sampling ``p_l ∝ n_l^(1/T)``.
* ``vocab``: SentencePiece source/target models (pad=0, eos=1, unk=2).
* ``packing``: first-fit packing into rows with segment ids/positions.
* ``tsv``: corpus TSV scanning; malformed lines found, counted, skipped.
* ``pipeline``: tf.data training stream and evaluation datasets.
* ``tfds_corpus``: the one TFDS reader (train, eval, decode); the offline
  builder ``m4moe_corpus`` of a built corpus; TFDS catalog translation sets.
* ``fixtures``: tiny synthetic catalogs and corpora (the smoke recipe's,
  the input-pipeline benchmark's and the tests').
"""
