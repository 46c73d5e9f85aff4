"""Sparse -> dense distillation (Switch Transformer §4.2): ``m4moe-distill``.

A dense student learns from a trained MoE teacher:

* Initialisation: every student variable the teacher has at the same path
  and shape is copied from the teacher's checkpoint (embeddings, attention,
  layer norms, output projection, and the dense FFNs of the layers that are
  dense in the teacher). The student's FFN at a layer where the teacher has
  an MoE layer keeps its fresh (seeded) initialisation, as Switch §4.2 does
  ("initialise the dense model with the non-expert weights"). Not the mean
  of the experts: the experts were initialised independently, so their
  hidden units are not aligned and the mean of their weights is not the
  mean of their functions (it computes neither expert); and an expert is
  usually narrower than the dense FFN (tiny/moe: 256 vs 512 hidden units),
  so the shapes do not even fit. The teacher's experts and routers are the
  only teacher variables left unused (:class:`InitReport` lists them).
* Objective: per target token, ``w * CE(p_teacher, p_student) + (1 - w) *
  CE_ls(y, p_student)``, i.e. the cross-entropy against the mixture of the
  teacher's distribution (weight ``w = --distill_teacher_weight``, 0.25 in
  Switch) and the (label-smoothed, ``--label_smoothing``) ground truth, summed
  over real tokens and divided by the step's token count as the plain loss is
  (:mod:`m4moe.training.step`). The teacher runs with ``training=False``
  (no dropout, eval routing: deterministic), so the loss is a function of
  the batch and the student, and a resumed run repeats it exactly.
* The teacher is read-only: its variables are created non-trainable, are
  not part of the student's checkpoints, and nothing is written to
  ``--teacher_dir``. The student is an ordinary :func:`m4moe.training.loop.train`
  run (resume, preemption, damaged-checkpoint recovery, early stopping).
  The run's ``config.json`` records the teacher checkpoint used
  (``"distill"`` section); a resume uses that checkpoint, even if the
  teacher run has saved newer ones since, and refuses another
  ``--teacher_dir`` or ``--distill_teacher_weight``.

Teacher / student compatibility (:func:`config_problems`): the student is
dense, and the flags that shape the copied variables (vocabulary sizes,
``--d_model``, ``--num_heads``, ``--d_kv``, ``--d_ff``, layer counts) equal the
teacher's; its SentencePiece models are the teacher's (the vocabulary
fingerprint of :mod:`m4moe.training.rundir`), and its languages are among the
teacher's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Any, Callable, Iterable, Mapping

import tensorflow as tf
from absl import logging

from m4moe import config as config_lib
from m4moe import errors
from m4moe.model import losses
from m4moe.training import rundir
from m4moe.moe import upcycle

_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_PREFIX = "model/"
SECTION = "distill"  # the config.json section of a distillation run


class DistillError(errors.ConfigError):
  """The teacher, the student or the run cannot be used; says what to fix."""


_require = functools.partial(errors.require, error=DistillError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
  """Settings of a distillation run (``m4moe-distill`` flags).

  Attributes:
    teacher_dir: the teacher's run directory (an MoE m4moe-train run).
    teacher_weight: w, the teacher distribution's share of the training
      target (1 - w: the ground truth); Switch uses 0.25.
  """

  teacher_dir: str
  teacher_weight: float = 0.25

  def __post_init__(self) -> None:
    _require(bool(self.teacher_dir), "teacher_dir", self.teacher_dir,
             "pass the model_dir of a trained MoE m4moe-train run")
    _require(0.0 <= self.teacher_weight <= 1.0, "distill_teacher_weight",
             self.teacher_weight, "use a value in [0, 1] (Switch: 0.25)")


def teacher_checkpoint(teacher_dir: str | os.PathLike[str]) -> str:
  """The latest checkpoint of the teacher run.

  Raises:
    DistillError: no checkpoint, no config.json, or a dense run.
  """
  path = tf.train.latest_checkpoint(str(teacher_dir))
  if path is None:
    raise DistillError(
        f"--teacher_dir={teacher_dir} has no checkpoint (no 'checkpoint' "
        "index file): pass the model_dir of a trained MoE m4moe-train run")
  config = teacher_config(teacher_dir)
  if not config.moe.enabled:
    raise DistillError(
        f"--teacher_dir={teacher_dir} is a dense run (--num_experts=0): "
        "distillation here is sparse -> dense; pass an MoE run")
  return path


def teacher_config(teacher_dir: str | os.PathLike[str]
                   ) -> config_lib.ModelConfig:
  """The teacher's ModelConfig (its config.json).

  Raises:
    DistillError: missing or unreadable config.json.
  """
  try:
    return rundir.model_config_from_run(teacher_dir)
  except rundir.RunDirError as e:
    raise DistillError(f"--teacher_dir={teacher_dir}: {e}") from e


# Model flags that shape the variables copied from the teacher.
_SHAPE_FLAGS = ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads",
                "d_kv", "d_ff", "num_encoder_layers", "num_decoder_layers")


def config_problems(*, student: config_lib.ModelConfig,
                    teacher: config_lib.ModelConfig) -> list[str]:
  """Why ``student`` cannot be distilled from ``teacher`` (empty: fine).

  Each problem names the student flag to set.
  """
  problems = []
  if student.moe.enabled:
    problems.append(
        f"the student has --num_experts={student.moe.num_experts}: it must "
        "be dense; use --student_config=tiny/dense or set --num_experts=0")
  for name in _SHAPE_FLAGS:
    mine, theirs = getattr(student, name), getattr(teacher, name)
    if mine != theirs:
      where = (" (the vocabulary sizes come from --vocab_dir)"
               if name.endswith("vocab_size") else "")
      problems.append(f"--{name}={mine} differs from the teacher's {theirs}"
                      f"{where}: set --{name}={theirs}")
  return problems


@dataclasses.dataclass(frozen=True)
class InitReport:
  """What :func:`init_student` did.

  Attributes:
    checkpoint: the teacher checkpoint read.
    copied: student variable paths copied from the same teacher path.
    fresh: student FFN variables at the teacher's MoE layers, left at their
      initialisation.
    unused: teacher variables with no place in the student (experts,
      routers).
  """

  checkpoint: str
  copied: tuple[str, ...]
  fresh: tuple[str, ...]
  unused: tuple[str, ...]


def _moe_ffn(path: str) -> str | None:
  """``.../ffn/wi`` -> ``.../ffn/`` (the FFN's prefix), else None."""
  parts = path.split("/")
  if len(parts) >= 2 and parts[-2] == "ffn":
    return "/".join(parts[:-1]) + "/"
  return None


def plan(student_variables: Mapping[str, tuple[int, ...]],
         teacher_variables: Mapping[str, tuple[int, ...]]
         ) -> tuple[list[str], list[str], list[str]]:
  """Matches student variables to teacher variables by path and shape.

  Args:
    student_variables: dense student path -> shape.
    teacher_variables: teacher path (checkpoint key without ``model/`` and
      the attribute suffix) -> shape.

  Returns:
    (copied, fresh, unused) paths; see :class:`InitReport`.

  Raises:
    DistillError: listing every student variable without a teacher
      counterpart (or of another shape) and every teacher variable left
      unused that is not part of an MoE layer's FFN.
  """
  copied, fresh, problems = [], [], []
  moe_ffns = {p.split("experts/")[0] for p in teacher_variables
              if "/ffn/experts/" in p}
  for path, shape in sorted(student_variables.items()):
    theirs = teacher_variables.get(path)
    if theirs is not None and tuple(theirs) == tuple(shape):
      copied.append(path)
    elif theirs is not None:
      problems.append(f"{path}: shape {list(shape)} here, {list(theirs)} in "
                      "the teacher (use the teacher's model flags: "
                      "--d_model, --num_heads, --d_kv, --d_ff, vocabularies)")
    elif _moe_ffn(path) in moe_ffns:
      fresh.append(path)
    else:
      problems.append(f"{path}: not in the teacher checkpoint (use the "
                      "teacher's --num_encoder_layers/--num_decoder_layers)")
  used = set(copied) | set(student_variables)
  unused = sorted(set(teacher_variables) - used)
  fresh_ffns = {_moe_ffn(p) for p in fresh}
  for path in unused:
    ffn = path.split("experts/")[0] if "/ffn/experts/" in path else (
        path.split("router/")[0] if "/ffn/router/" in path else None)
    if ffn not in fresh_ffns:
      problems.append(f"{path}: teacher variable with no place in the "
                      "student")
  if problems:
    raise DistillError(
        f"cannot initialise the student from the teacher: {len(problems)} "
        "unmatched variable(s):\n  " + "\n  ".join(problems))
  return copied, fresh, unused


def _checkpoint_variables(reader) -> dict[str, tuple[int, ...]]:
  """Model variable path -> shape of a checkpoint (see upcycle's keys)."""
  return {key[len(_PREFIX):-len(_SUFFIX)]: tuple(shape)
          for key, shape in reader.get_variable_to_shape_map().items()
          if key.startswith(_PREFIX) and key.endswith(_SUFFIX)}


def init_student(*, student: tf.Module, checkpoint: str) -> InitReport:
  """Copies the teacher's non-expert weights into the built student.

  Args:
    student: the freshly built dense Transformer (variables created).
    checkpoint: the teacher checkpoint (:func:`teacher_checkpoint`).

  Returns:
    The :class:`InitReport`.

  Raises:
    DistillError: unmatched variables (see :func:`plan`).
  """
  reader = tf.train.load_checkpoint(checkpoint)
  variables = upcycle.variable_paths(student)
  copied, fresh, unused = plan(
      {p: tuple(v.shape) for p, v in variables.items()},
      _checkpoint_variables(reader))
  for path in copied:
    variables[path].assign(reader.get_tensor(_PREFIX + path + _SUFFIX))
  logging.info("Student initialised from %s: %d variables copied, %d FFN "
               "variables fresh at the teacher's MoE layers, %d expert/router "
               "variables unused", checkpoint, len(copied), len(fresh),
               len(unused))
  return InitReport(checkpoint=checkpoint, copied=tuple(copied),
                    fresh=tuple(fresh), unused=tuple(unused))


def _not_trainable(next_creator, **kwargs):
  kwargs["trainable"] = False
  return next_creator(**kwargs)


def load_teacher(*, config: config_lib.ModelConfig,
                 checkpoint: str) -> tf.Module:
  """The teacher Transformer restored from ``checkpoint``, read-only.

  Its variables are non-trainable (no gradient tape watches them, no
  optimiser updates them) and every one must be restored.
  """
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  with tf.variable_creator_scope(_not_trainable):
    teacher = model_lib.Transformer(config=config, name="teacher")
  status = tf.train.Checkpoint(model=teacher).read(checkpoint)
  status.expect_partial()  # the optimiser and counters stay on disk
  try:
    status.assert_existing_objects_matched()
  except AssertionError as e:
    raise DistillError(f"{checkpoint} does not hold every variable of the "
                       f"teacher's config.json model: {e}") from e
  return teacher


class DistillationLoss:
  """The student's training loss: teacher and ground truth mixed.

  A :class:`m4moe.training.step.StepRunner` ``token_loss``: per real target
  token ``w * CE(softmax(teacher logits), student) + (1 - w) *
  CE_ls(y, student)``, summed.

  Args:
    teacher: the read-only teacher (:func:`load_teacher`); called as
      ``teacher(batch, training=False)``.
    teacher_weight: w in [0, 1].
  """

  def __init__(self, *, teacher: tf.Module, teacher_weight: float):
    _require(0.0 <= teacher_weight <= 1.0, "distill_teacher_weight",
             teacher_weight, "use a value in [0, 1] (Switch: 0.25)")
    self.teacher = teacher
    self.teacher_weight = float(teacher_weight)

  def __call__(self, *, logits: tf.Tensor, batch: Mapping[str, tf.Tensor],
               weights: tf.Tensor, label_smoothing: float) -> tf.Tensor:
    """The mixed loss summed over tokens.

    Args:
      logits: <float32>[B, Lt, V] the student's.
      batch: the model batch both models see (``targets`` <int32>[B, Lt]).
      weights: <float32>[B, Lt] per-token weights (0 = padding).
      label_smoothing: eps of the ground-truth part.

    Returns:
      <float32>[] the weighted sum over tokens.
    """
    teacher_logits = self.teacher(batch, training=False).logits
    return mixed_token_loss(logits=logits, teacher_logits=teacher_logits,
                            targets=batch["targets"], weights=weights,
                            teacher_weight=self.teacher_weight,
                            label_smoothing=label_smoothing)


def mixed_token_loss(*, logits: tf.Tensor, teacher_logits: tf.Tensor,
                     targets: tf.Tensor, weights: tf.Tensor,
                     teacher_weight: float,
                     label_smoothing: float) -> tf.Tensor:
  """``sum_t weights_t * (w * soft_t + (1 - w) * hard_t)``.

  Args:
    logits: <float32>[B, Lt, V] the student's.
    teacher_logits: <float32>[B, Lt, V] the teacher's (no gradient).
    targets: <int32>[B, Lt] ground truth.
    weights: <float32>[B, Lt].
    teacher_weight: w in [0, 1].
    label_smoothing: eps of the ground-truth cross-entropy.

  Returns:
    <float32>[].
  """
  hard = losses.per_token_cross_entropy(logits, targets,
                                        label_smoothing=label_smoothing)
  per_token = (1.0 - teacher_weight) * hard
  if teacher_weight:
    soft = losses.per_token_soft_cross_entropy(logits, teacher_logits)
    per_token += teacher_weight * soft
  return tf.reduce_sum(per_token * tf.cast(weights, tf.float32))


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What ``m4moe-distill`` needs before training (:func:`prepare`).

  Attributes:
    problems: each names the flag to fix (empty: go on).
    teacher_checkpoint: the checkpoint to distil from (None on problems).
    teacher_config: the teacher's model config (None on problems).
    section: the ``config.json`` "distill" section of the run.
    warm_start: ``warm_start(model, optimizer)`` for a fresh run (None
      when resuming).
    resumed: the run already has a checkpoint.
  """

  problems: tuple[str, ...]
  teacher_checkpoint: str | None = None
  teacher_config: config_lib.ModelConfig | None = None
  section: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  warm_start: Callable[[tf.Module, Any], None] | None = None
  resumed: bool = False


def _vocab_problems(teacher_dir: pathlib.Path, run_config: Mapping[str, Any],
                    vocab_dir: str) -> list[str]:
  recorded = run_config.get("vocab")
  if recorded is None:
    if vocab_dir:
      logging.warning("%s records no vocabulary fingerprint: cannot check "
                      "that --vocab_dir=%s holds its models", teacher_dir,
                      vocab_dir)
    return []
  if not vocab_dir:
    return [f"--teacher_dir={teacher_dir} was trained with the "
            f"SentencePiece models of {pathlib.Path(recorded['source']['path']).parent}"
            "; train the student on a corpus with --vocab_dir (not "
            "--synthetic_data)"]
  vocab = pathlib.Path(vocab_dir)
  try:
    rundir.check_vocab(rundir.VocabFingerprint.from_dict(recorded),
                       source=vocab / rundir.SOURCE_MODEL,
                       target=vocab / rundir.TARGET_MODEL,
                       model_dir=f"the teacher {teacher_dir}")
  except (KeyError, TypeError) as e:
    return [f"{teacher_dir / rundir.CONFIG_FILENAME}: malformed \"vocab\" "
            f"section ({e!r})"]
  except (rundir.VocabMismatchError, OSError) as e:
    return [f"--vocab_dir: {e}"]
  return []


def _language_problems(teacher_dir: pathlib.Path,
                       run_config: Mapping[str, Any],
                       languages: Iterable[str]) -> list[str]:
  taught = run_config.get("languages")
  if taught is None:
    return []
  missing = sorted(set(languages) - set(taught))
  if not missing:
    return []
  return [f"--languages: the teacher {teacher_dir} was not trained on "
          f"{', '.join(missing)} (its languages: {', '.join(taught)}); "
          "drop them or pass a teacher that knows them"]


def _resume_problems(model_dir: str, config: DistillConfig
                     ) -> tuple[list[str], str | None]:
  """(problems, recorded teacher checkpoint) of resuming ``model_dir``."""
  try:
    recorded = rundir.read_run_config(model_dir).get(SECTION)
  except rundir.RunDirError as e:
    return [f"--model_dir: {e}"], None
  if recorded is None:
    return [f"--model_dir={model_dir} holds a run that was not distilled "
            "(no \"distill\" section in its config.json): use a fresh "
            "--model_dir"], None
  problems = []
  want_dir = str(pathlib.Path(config.teacher_dir).resolve())
  if recorded.get("teacher_dir") != want_dir:
    problems.append(
        f"--teacher_dir={config.teacher_dir} differs from the teacher this "
        f"run was started with ({recorded.get('teacher_dir')}): pass "
        f"--teacher_dir={recorded.get('teacher_dir')} to resume, or use a "
        "fresh --model_dir")
  if recorded.get("teacher_weight") != config.teacher_weight:
    problems.append(
        f"--distill_teacher_weight={config.teacher_weight} differs from "
        f"this run's {recorded.get('teacher_weight')}: pass "
        f"--distill_teacher_weight={recorded.get('teacher_weight')} to "
        "resume, or use a fresh --model_dir")
  checkpoint = recorded.get("teacher_checkpoint")
  if checkpoint and not tf.io.gfile.exists(checkpoint + ".index"):
    problems.append(
        f"the teacher checkpoint this run distils from, {checkpoint}, is "
        "gone (the teacher run deleted it?): restore it to resume exactly, "
        "or use a fresh --model_dir")
  return problems, checkpoint


def prepare(*, config: DistillConfig, student: config_lib.ModelConfig,
            model_dir: str, vocab_dir: str,
            languages: Iterable[str]) -> Prepared:
  """Checks teacher, student and run before anything is written.

  Args:
    config: the distillation settings.
    student: the student's model config.
    model_dir: the student's ``--model_dir`` (a checkpoint there: resume).
    vocab_dir: the student's ``--vocab_dir`` ("" for synthetic data).
    languages: the student's training languages.

  Returns:
    The :class:`Prepared` run; its ``problems`` name the flags to fix.
  """
  teacher_dir = pathlib.Path(config.teacher_dir)
  try:
    checkpoint = teacher_checkpoint(teacher_dir)
    teacher = teacher_config(teacher_dir)
    run_config = rundir.read_run_config(teacher_dir)
  except (DistillError, rundir.RunDirError) as e:
    return Prepared(problems=(str(e),))
  problems = config_problems(student=student, teacher=teacher)
  problems += _vocab_problems(teacher_dir, run_config, vocab_dir)
  problems += _language_problems(teacher_dir, run_config, languages)
  resumed = tf.train.latest_checkpoint(model_dir) is not None
  if resumed:
    resume_problems, recorded = _resume_problems(model_dir, config)
    problems += resume_problems
    checkpoint = recorded or checkpoint
  section = {"teacher_dir": str(teacher_dir.resolve()),
             "teacher_checkpoint": str(pathlib.Path(checkpoint).resolve()),
             "teacher_weight": config.teacher_weight}

  def warm_start(model: tf.Module, optimizer: Any) -> None:
    del optimizer  # the student's optimiser starts fresh
    init_student(student=model, checkpoint=section["teacher_checkpoint"])

  return Prepared(problems=tuple(problems),
                  teacher_checkpoint=section["teacher_checkpoint"],
                  teacher_config=teacher, section=section,
                  warm_start=None if resumed else warm_start,
                  resumed=resumed)
