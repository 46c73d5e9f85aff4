"""The main job (``m4moe-run``): a recipe as resumable stages.

* ``recipes``: what ``m4moe-run`` builds, trains and evaluates, as data.
* ``plan``: the recipes' stage plans, resumable stage by stage.
* ``recipe_check``: a recipe checked whole before its first stage runs.
* ``corpus_check``: whether a built corpus holds enough for its recipe to
  be reported on.
* ``supervisor``: the stage processes, in lanes, with no orphans.
* ``landing``: landed copies of a recipe's runs, which survive a lost run
  directory.
* ``restore``: seeds a study run directory with runs already committed.
* ``curves``: dev CE curves of runs against a reference, at equal steps
  and CPU time.
* ``screening``: the selection table of a dev-only recipe.
* ``equal_cost``: candidates read at equal measured step cost, which the
  machine's drifting speed does not move.
* ``baseline_rates``: each bilingual baseline's peak rate, chosen per
  language on dev CE.
"""
