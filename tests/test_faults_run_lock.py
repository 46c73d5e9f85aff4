"""One job per run directory: m4moe-run's lock, with real processes.

Two jobs on one --run_dir started together: exactly one runs, the other
exits 1 before any stage, naming the first's pid and command. After a
kill -9 of the first, the kernel has released its lock and a new job runs.
The jobs run a tiny fake plan (one stage that sleeps) so nothing trains;
the job that is finally allowed is the real CLI's smoke corpus stage.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from m4moe import run_lock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="needs Linux (/proc, prctl, flock)")

# m4moe-run's main with a one-stage plan whose stage prints its pid and
# sleeps; argv[1] is the --run_dir.
FAKE_JOB = r'''
import sys
from m4moe.pipeline import plan as main_job
from m4moe.cli import run as run_cli

class SleepStage(main_job.Stage):
  def command(self):
    return [sys.executable, "-c",
            "import os, time; print('STAGE', os.getpid(), flush=True); "
            "time.sleep(600)"]

main_job.plan = lambda recipe, *, run_dir, cache_dir: [
    SleepStage(name="sleep", description="sleep", tool="x", args=())]
sys.argv = ["m4moe-run", "--recipe=smoke", f"--run_dir={sys.argv[1]}"]
run_cli.run()
'''


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


@pytest.fixture(name="started")
def fixture_started():
  pids = []
  yield pids
  for pid in pids:
    if _alive(pid):
      os.kill(pid, signal.SIGKILL)


def _wait_gone(pid):
  deadline = time.monotonic() + 60
  while _alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not _alive(pid)


def test_two_jobs_started_together_one_refuses_then_kill9_frees_it(
    tmp_path, started):
  script = tmp_path / "job.py"
  script.write_text(FAKE_JOB)
  run_dir = tmp_path / "run"
  jobs = [subprocess.Popen([sys.executable, str(script), str(run_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) for _ in range(2)]
  started.extend(j.pid for j in jobs)
  # The loser exits on its own; the winner's stage runs until killed.
  deadline = time.monotonic() + 120
  while all(j.poll() is None for j in jobs) and time.monotonic() < deadline:
    time.sleep(0.05)
  losers = [j for j in jobs if j.poll() is not None]
  assert len(losers) == 1, "neither job was refused"
  loser = losers[0]
  winner = jobs[1 - jobs.index(loser)]
  _, err = loser.communicate(timeout=60)
  assert loser.returncode == 1
  assert f"is in use by pid {winner.pid}" in err
  # The first job's command.
  assert f"(m4moe-run --recipe=smoke --run_dir={run_dir})" in err
  assert "only one m4moe-run job may use a --run_dir" in err
  assert "use another --run_dir" in err
  assert "Traceback" not in err
  for line in winner.stdout:  # after the stage header and command
    if line.startswith("STAGE "):
      break
  stage = int(line.split()[1])
  started.append(stage)
  # Only the winner's stage ran; the loser recorded and ran nothing.
  assert not (run_dir / "stages").exists()

  winner.send_signal(signal.SIGKILL)
  winner.wait(timeout=60)
  _wait_gone(stage)  # the kernel's SIGTERM (parent death) ends the stage
  allowed = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.run", "--recipe=smoke",
       f"--run_dir={run_dir}", "--stop_after=corpus"],
      capture_output=True, text=True, timeout=600, check=False)
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert (run_dir / "stages" / "corpus.json").is_file()
  assert (run_dir / "corpus" / "train" / "de.tsv").is_file()


def test_a_held_run_lock_refuses_the_real_cli_before_any_stage(tmp_path):
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  with run_lock.RunLock(run_dir, role=run_lock.RUN):
    refused = subprocess.run(
        [sys.executable, "-m", "m4moe.cli.run", "--recipe=smoke",
         f"--run_dir={run_dir}", "--stop_after=corpus"],
        capture_output=True, text=True, timeout=600, check=False)
    # A dry run changes nothing and is allowed beside a running job.
    dry = subprocess.run(
        [sys.executable, "-m", "m4moe.cli.run", "--recipe=smoke",
         f"--run_dir={run_dir}", "--dry_run"],
        capture_output=True, text=True, timeout=600, check=False)
  assert refused.returncode == 1
  assert f"is in use by pid {os.getpid()}" in refused.stderr
  assert "refused, nothing was run" in refused.stderr
  assert not (run_dir / "fixture_catalogs").exists()
  assert not (run_dir / "corpus").exists()
  assert dry.returncode == 0, dry.stderr[-2000:]
  assert "[stage 1/" in dry.stdout


HOLDER = r'''
import fcntl, json, os, socket, sys, time
f = open(sys.argv[1], "a+", encoding="utf-8")
fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
print("LOCKED", flush=True)
time.sleep(float(sys.argv[2]))  # the window between the lock and the record
f.seek(0)
f.truncate()
json.dump({"pid": os.getpid(), "host": socket.gethostname()}, f)
f.flush()
print("WROTE", flush=True)
time.sleep(600)
'''


@pytest.mark.parametrize("previous", [None, "dead"])
def test_refused_process_waits_for_the_holders_record(tmp_path, started,
                                                      previous):
  """Refused between the holder's flock and its record: the message still
  names the holder, not "another process" or the previous, dead holder."""
  lock = tmp_path / run_lock.RUN.filename
  if previous == "dead":  # a finished holder's record stays in the file
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True, text=True, check=True)
    lock.write_text(f'{{"pid": {dead.stdout.strip()}, "host": '
                    f'"{socket.gethostname()}"}}\n')
  script = tmp_path / "holder.py"
  script.write_text(HOLDER)
  holder = subprocess.Popen([sys.executable, str(script), str(lock), "0.5"],
                            stdout=subprocess.PIPE, text=True)
  started.append(holder.pid)
  assert holder.stdout.readline().strip() == "LOCKED"
  with pytest.raises(run_lock.RunLockedError,
                     match=rf"in use by pid {holder.pid} on "):
    with run_lock.RunLock(tmp_path, role=run_lock.RUN):
      pass
  assert holder.stdout.readline().strip() == "WROTE"
