"""Inference: beam and greedy search, and one-language expert extraction.

* ``beam_search``: beam and greedy search over the incremental decoder.
* ``extraction``: keeps one language's experts (``m4moe-export --language``).

The translator and SavedModel export used by ``m4moe-eval`` and
``m4moe-export`` live in :mod:`m4moe.eval`.
"""
