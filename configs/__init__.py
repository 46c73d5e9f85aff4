"""The m4moe model zoo: absl flagfiles, installed as ``m4moe.configs``.

Name an entry by its path without ``.flags``, e.g. ``--config=tiny/moe``, or
pass a flagfile path. See ``m4moe.config.load_model_config``.
"""
