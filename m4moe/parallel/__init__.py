"""Device meshes and GShard sharding annotations.

* ``mesh``: DTensor meshes (data, expert and model axes) from flags.
* ``sharding``: the per-tensor layouts and the AllToAll of local groups.
"""
