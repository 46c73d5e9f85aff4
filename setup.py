"""m4moe: sparsely-gated Mixture-of-Experts Transformers for massively
multilingual translation in TensorFlow 2 (GShard / Switch style).

One top-level package, ``m4moe``, is installed. The repository's ``data/``
(corpus recipes and builders), ``eval/`` (evaluation and reporting) and
``configs/`` (the model zoo) directories are installed inside it as
``m4moe.data``, ``m4moe.eval`` and ``m4moe.configs`` through ``package_dir``,
so the code and files they hold are importable and found at run time without
the source tree.

TensorFlow: ``tensorflow-cpu`` on x86-64 (the CPU build, a smaller download
with no CUDA libraries), ``tensorflow`` elsewhere (aarch64 wheels hold the
CPU build). ``M4MOE_TENSORFLOW=gpu`` in the environment of ``pip install``
requires ``tensorflow[and-cuda]`` instead, which brings the CUDA and cuDNN
wheels TensorFlow was built against (Linux x86-64 only; docs/gpu.md). An
extra cannot do this: extras add requirements and cannot remove the CPU
pin, and ``tensorflow-cpu`` and ``tensorflow`` install the same files.
"""

import os

import setuptools

CONSOLE_SCRIPTS = [
    f"m4moe-{name.replace('_', '-')}=m4moe.cli.{name}:run"
    for name in ("info", "build_corpus", "vocab", "train", "decode", "export",
                 "eval", "report", "run", "bench", "analyze_routing", "distill",
                 "split_keys", "average")
]

# What M4MOE_TENSORFLOW=gpu puts in place of install_requires' TensorFlow
# lines (the version must stay theirs).
GPU_TENSORFLOW = "tensorflow[and-cuda]==2.21.0"
_TENSORFLOW_NAMES = ("tensorflow", "tensorflow-cpu")


def tensorflow_choice(requires: list[str]) -> list[str]:
  """``requires`` with the TensorFlow lines ``M4MOE_TENSORFLOW`` selects:
  ``cpu`` (the default) keeps them, ``gpu`` puts :data:`GPU_TENSORFLOW` in
  their place; anything else stops the install naming the choices."""
  choice = os.environ.get("M4MOE_TENSORFLOW", "").strip().lower() or "cpu"
  if choice not in ("cpu", "gpu"):
    raise SystemExit(
        f"setup.py: M4MOE_TENSORFLOW={choice!r} is not a choice; set it to "
        "cpu or gpu, or unset it (cpu)")
  if choice == "cpu":
    return requires
  others = [r for r in requires
            if r.split("=")[0].strip() not in _TENSORFLOW_NAMES]
  return [GPU_TENSORFLOW, *others]


def setup(**kwargs) -> None:
  """``setuptools.setup`` with the TensorFlow :func:`tensorflow_choice`
  selects."""
  kwargs["install_requires"] = tensorflow_choice(kwargs["install_requires"])
  setuptools.setup(**kwargs)


setup(
    name="m4moe",
    version="0.1.0",
    description=("GShard-style Mixture-of-Experts Transformers for massively "
                 "multilingual machine translation in TensorFlow 2"),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=["License :: OSI Approved :: Apache Software License"],
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
        # pytest-xdist: the fast suite runs on every core (-n auto).
        "test": ["pytest>=8", "pytest-xdist>=3.5"],
        "tpu": [],  # see README: install tensorflow-tpu on a TPU VM instead.
        "cjk": ["sacrebleu[ja,ko]"],
    },
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
