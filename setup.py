"""m4moe: sparsely-gated Mixture-of-Experts Transformers for massively
multilingual translation in TensorFlow 2 (GShard / Switch style).

One top-level package, ``m4moe``, is installed. The repository's ``data/``
(corpus recipes and builders), ``eval/`` (evaluation and reporting) and
``configs/`` (the model zoo) directories are installed inside it as
``m4moe.data``, ``m4moe.eval`` and ``m4moe.configs`` through ``package_dir``,
so the code and files they hold are importable and found at run time without
the source tree.
"""

import setuptools

CONSOLE_SCRIPTS = [
    f"m4moe-{name.replace('_', '-')}=m4moe.cli.{name}:run"
    for name in ("info", "build_corpus", "vocab", "train", "decode", "export",
                 "eval", "report", "run", "bench", "analyze_routing", "distill",
                 "split_keys", "average")
]

setuptools.setup(
    name="m4moe",
    version="0.1.0",
    description=("GShard-style Mixture-of-Experts Transformers for massively "
                 "multilingual machine translation in TensorFlow 2"),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["m4moe", "m4moe.*"]) + [
        "m4moe.configs", "m4moe.data", "m4moe.eval",
    ],
    package_dir={
        "m4moe.configs": "configs",
        "m4moe.data": "data",
        "m4moe.eval": "eval",
    },
    package_data={
        "m4moe.configs": ["*.flags", "*/*.flags", "recipes/*.toml"],
        "m4moe.data": ["recipes/*.txt", "splits/*"],
    },
    install_requires=[
        "tensorflow-cpu==2.21.0; platform_machine=='x86_64' or platform_machine=='AMD64'",
        "tensorflow==2.21.0; platform_machine!='x86_64' and platform_machine!='AMD64'",
        "absl-py>=2.1",
        "numpy>=1.26",
        "sentencepiece>=0.2",
        "sacrebleu>=2.4",
        "tensorflow-datasets>=4.9.8",
        "polib>=1.2",
        "matplotlib>=3.8",
        # Student-t quantiles for the seed intervals (m4moe.eval.seeds).
        "scipy>=1.11",
        # m4moe-train writes TensorBoard events; this makes
        # `tensorboard --logdir RUN_DIR` work after the documented install.
        "tensorboard==2.21.*",
    ],
    extras_require={
        "test": ["pytest>=8"],
        "tpu": [],  # see README: install tensorflow-tpu on a TPU VM instead.
        "cjk": ["sacrebleu[ja,ko]"],
    },
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
