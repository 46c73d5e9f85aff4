"""m4moe-run's stage processes with real subprocesses: a stopped or
kill -9ed job leaves no stage running."""

import os
import signal
import subprocess
import sys
import time

import pytest

# /proc and PR_SET_PDEATHSIG are Linux's.
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="needs Linux (/proc, prctl)")

# The stage: reports its pid, then waits; on SIGTERM/SIGINT it says so and
# exits 3 (as a stage that cleans up, e.g. m4moe-train saving a checkpoint).
STAGE = r'''
import os, signal, sys, time
def stop(signum, frame):
  print("STAGE_GOT", signum, flush=True)
  sys.exit(3)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("STAGE", os.getpid(), flush=True)
# Short sleeps: Python runs a handler between bytecodes, so a signal that
# lands after the last check but before a sleep's syscall starts would wait
# out the whole sleep; the next short one runs it.
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
  time.sleep(0.05)
'''

# The job: runs the stage through supervisor.run_stage_process, as m4moe-run.
JOB = r'''
import sys
from m4moe.pipeline import supervisor
result = supervisor.run_stage_process([sys.executable, sys.argv[1]])
print("JOB", result.returncode, result.interrupted_by, flush=True)
'''


@pytest.fixture(name="started")
def fixture_started():
  """Pids the test started; any still running at teardown are killed, so a
  failing test leaves no process behind either."""
  pids = []
  yield pids
  for pid in pids:
    if _alive(pid):
      os.kill(pid, signal.SIGKILL)


def _start(tmp_path, started):
  (tmp_path / "stage.py").write_text(STAGE)
  (tmp_path / "job.py").write_text(JOB)
  job = subprocess.Popen(
      [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "stage.py")],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  started.append(job.pid)
  line = job.stdout.readline().split()
  assert line[0] == "STAGE", line
  started.append(int(line[1]))
  return job, int(line[1])


def _alive(pid):
  """Whether pid runs (a zombie awaiting its reaper counts as gone)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_job_is_forwarded_to_the_stage(tmp_path, sig, started):
  job, stage = _start(tmp_path, started)
  job.send_signal(sig)
  out, _ = job.communicate(timeout=60)
  # The stage got the same signal, cleaned up, and the job waited for it.
  assert out.split("\n")[:2] == [f"STAGE_GOT {int(sig)}",
                                 f"JOB 3 {int(sig)}"]
  assert job.returncode == 0
  assert not _alive(stage)


def test_the_stage_has_its_own_process_group(tmp_path, started):
  # A terminal's Ctrl-C goes to the foreground process group: the job's,
  # which forwards it once, not to the stage a second time.
  job, stage = _start(tmp_path, started)
  assert os.getpgid(stage) == stage != os.getpgid(job.pid)
  job.send_signal(signal.SIGTERM)
  job.communicate(timeout=60)


def test_kill9_of_the_job_takes_the_stage_down(tmp_path, started):
  job, stage = _start(tmp_path, started)
  job.send_signal(signal.SIGKILL)
  job.wait(timeout=60)
  deadline = time.monotonic() + 60
  while _alive(stage) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _alive(stage)
  # It died of the SIGTERM the kernel sent when its parent died.
  assert job.stdout.read().split() == ["STAGE_GOT", str(int(signal.SIGTERM))]


def test_run_cli_stops_and_names_the_signal(tmp_path, started):
  """m4moe-run itself: SIGTERM while the first stage runs stops that stage
  and the job (exit 143), records nothing, and says how to resume."""
  run_dir = tmp_path / "run"
  job = subprocess.Popen(
      [sys.executable, "-c", "from m4moe.cli.run import run; run()",
       "--recipe=smoke", f"--run_dir={run_dir}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  try:
    for line in job.stdout:
      if line.strip().startswith("$ "):  # the corpus stage's command
        break
    children = []
    deadline = time.monotonic() + 60
    while not children and time.monotonic() < deadline:
      with open(f"/proc/{job.pid}/task/{job.pid}/children",
                encoding="utf-8") as f:
        children = [int(p) for p in f.read().split()]
      started.extend(children)
      time.sleep(0.05)
    assert children, "the corpus stage did not start"
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
  finally:
    if job.poll() is None:
      os.killpg(job.pid, signal.SIGKILL)
  assert job.returncode == 128 + signal.SIGTERM
  assert "m4moe-run: stopped by SIGTERM during stage 'corpus'" in err
  assert "re-run the same command to resume" in err
  assert "Traceback" not in err
  for pid in children:
    assert not _alive(pid)
  assert not (run_dir / "stages" / "corpus.json").exists()
