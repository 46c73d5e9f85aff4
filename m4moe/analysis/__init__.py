"""Which experts each language uses (``m4moe-analyze-routing``).

* ``capture``: runs a trained model on a split and records its routing.
* ``statistics``: per-language expert loads, mutual information, overlap.
* ``page``: the routing page (PNG figures and self-contained HTML).
"""
