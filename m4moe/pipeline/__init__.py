"""The main job (``m4moe-run``): a recipe as resumable stages.

* ``plan``: the recipes' stage plans and the process supervisor that runs
  them in lanes.
"""
