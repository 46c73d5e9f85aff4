"""The sparsely-gated Mixture-of-Experts feed-forward layer.

* ``routing``: the routers (top-2 GShard, top-1 Switch, noisy top-k,
  expert choice) and their typed results.
* ``placement``: capacity: the buffer position of each chosen expert,
  No-Token-Left-Behind re-routing, the per-slot view.
* ``dispatch``: the dispatch paths that move tokens to expert buffers and
  back, their registry and resolver.
* ``grouping``: a batch's tokens compacted and cut into routing groups,
  and back (permutation gathers with gather-only gradients).
* ``layer``: the MoE layer, its experts and local group dispatching.
* ``task_routing``: routing by language (``--route_by=language``).
* ``upcycle``: dense -> MoE initialisation (``--init_from_dense``).
* ``upcycle_checks``: whether a config can be upcycled, without TensorFlow.
"""
