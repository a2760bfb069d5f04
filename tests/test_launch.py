"""experiments.launch: rank-prefixed output, failure handling, emulated links, cleanup.

The --link tests need root and iproute2 (CI has both) and are skipped otherwise.
What a launch leaves behind is checked with `ip` and /etc/netns directly, not
with the launcher's own listing.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from experiments import distributed, launch, netns, procenv, supervisor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HELLO = """
import os, sys
rank, n = os.environ["JAXCOMP_PROCESS_ID"], os.environ["JAXCOMP_NUM_PROCESSES"]
print(f"hello {rank} of {n} {sys.argv[1:]} {os.environ['JAX_COORDINATOR_ADDRESS']}")
print(f"note {rank}", file=sys.stderr)
"""

# Every process runs psum under jax.shard_map over gloo in a loop; rank 1 may
# SIGKILL itself at step KILL_AT (-1: never).
COLLECTIVE_LOOP = """
import os, signal
from experiments import distributed
distributed.initialize_from_env()
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ("p",), axis_types=(jax.sharding.AxisType.Auto,))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")),
                                           np.ones((jax.local_device_count(), 4), np.float32))
f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "p"), mesh=mesh, in_specs=P("p"), out_specs=P()))
kill_at = int(os.environ.get("KILL_AT", "-1"))
for step in range(10**9):
  total = float(np.asarray(f(x).addressable_data(0))[0, 0])
  assert total == jax.process_count(), total
  if step in (0, 10):
    print("step", step, "psum", total, flush=True)
  if jax.process_index() == 1 and step == kill_at:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _env(**extra):
  env = dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  env.update(extra)
  return env


def _launch(args, timeout=90, **env):
  """Runs the launcher to the end; returns (CompletedProcess, seconds, launcher pid)."""
  t0 = time.monotonic()
  proc = subprocess.Popen([sys.executable, "-m", "experiments.launch", *args], cwd=REPO,
                          env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = proc.communicate(timeout=timeout)
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - t0, proc.pid


class _Running:
  """A launcher in the background whose output lines are collected as they come."""

  def __init__(self, args, **env):
    self.proc = subprocess.Popen([sys.executable, "-m", "experiments.launch", *args], cwd=REPO,
                                 env=_env(**env), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    self.lines = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stdout:
      self.lines.append(line)

  def wait_for(self, texts, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
      if all(any(t in line for line in self.lines) for t in texts):
        return
      if self.proc.poll() is not None:
        break
      time.sleep(0.05)
    self.proc.kill()
    pytest.fail(f"never saw {texts}; output:\n{''.join(self.lines)}")

  def finish(self, timeout=60):
    self.proc.wait(timeout=timeout)
    self._reader.join(5)
    return "".join(self.lines)


# --------------------------------------------------------------------------- loopback


@pytest.mark.parametrize("form", ["-c", "-m", "script"])
def test_rank_prefixes_and_program_forms(form, tmp_path):
  (tmp_path / "hello_mod.py").write_text(HELLO)
  program = {"-c": ["-c", HELLO], "-m": ["-m", "hello_mod"],
             "script": [str(tmp_path / "hello_mod.py")]}[form]
  res, _, _ = _launch(["--processes", "3", "--", *program, "a", "--b"],
                      PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")
  assert res.returncode == 0, res.stderr
  lines = sorted(res.stdout.splitlines())
  assert len(lines) == 3, res.stdout
  coordinator = lines[0].split()[-1]
  assert coordinator.startswith("127.0.0.1:")
  assert lines == [f"[rank{r}]: hello {r} of 3 ['a', '--b'] {coordinator}" for r in range(3)]
  assert sorted(line for line in res.stderr.splitlines() if "note" in line) == [
      f"[rank{r}]: note {r}" for r in range(3)]


def test_carriage_returns_and_unterminated_lines_keep_the_prefix():
  code = ("import sys, time\nsys.stdout.write('bar 1\\rbar 2\\r'); sys.stdout.flush(); time.sleep(0.2)\n"
          "sys.stdout.write('\\nok\\r\\n\\rtq 1\\rtq 2\\nend')\n")
  res = subprocess.run([sys.executable, "-m", "experiments.launch", "--processes", "1", "--",
                        "-c", code], cwd=REPO, env=_env(), capture_output=True, timeout=60)
  assert res.returncode == 0, res.stderr
  assert res.stdout == (b"[rank0]: bar 1\r[rank0]: bar 2\r\n[rank0]: ok\r\n"
                        b"\r[rank0]: tq 1\r[rank0]: tq 2\n[rank0]: end\n")  # tqdm's leading \r: one prefix


def test_failed_rank_ends_the_others():
  code = ("import os, sys, time\nif os.environ['JAXCOMP_PROCESS_ID'] == '1':\n"
          "  time.sleep(0.3); sys.exit(3)\ntime.sleep(300)\n")
  res, seconds, _ = _launch(["--processes", "3", "--grace", "2", "--", "-c", code])
  assert res.returncode == 3, res.stderr
  assert seconds < 60
  assert "rank 1 exited with code 3" in res.stderr
  assert "ended rank(s) 0, 2" in res.stderr


def test_sigkilled_rank_ends_a_jax_collective_loop():
  res, seconds, _ = _launch(["--processes", "2", "--grace", "3", "--", "-c", COLLECTIVE_LOOP],
                            KILL_AT="10")
  assert "[rank0]: step 10 psum 2.0" in res.stdout, res.stdout + res.stderr  # rank 0 was looping
  assert res.returncode == 128 + signal.SIGKILL, res.stderr
  assert seconds < 60
  summary = [line for line in res.stderr.splitlines() if line.startswith("[launch]")]
  assert len(summary) == 1 and "rank 1 was killed by signal SIGKILL" in summary[0], res.stderr
  assert "ended rank(s) 0" in summary[0]


# Every rank prints "up", then on SIGTERM exits with code 75 (as experiments.train does once it
# has saved) after SAVE_SECONDS; with IGNORE_RANK set, that rank ignores SIGTERM instead. The
# ranks in SELF_TERM send SIGTERM to themselves, rank r after r seconds.
SAVES_ON_SIGTERM = """
import os, signal, sys, time
rank = os.environ["JAXCOMP_PROCESS_ID"]
def saved(signum, frame):
  time.sleep(float(os.environ.get("SAVE_SECONDS", "0")))
  print("saved", flush=True)
  sys.exit(75)
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_RANK") == rank else saved)
print("up", flush=True)
if rank in os.environ.get("SELF_TERM", "").split(","):
  time.sleep(int(rank))
  os.kill(os.getpid(), signal.SIGTERM)
time.sleep(300)
"""


def test_sigterm_gives_the_ranks_grace_to_save_and_passes_75_through():
  run = _Running(["--processes", "2", "--grace", "30", "--", "-c", SAVES_ON_SIGTERM], SAVE_SECONDS="1.5")
  run.wait_for(["[rank0]: up", "[rank1]: up"])
  run.proc.send_signal(signal.SIGTERM)
  out = run.finish()
  assert run.proc.returncode == 75, out
  assert "[rank0]: saved" in out and "[rank1]: saved" in out  # not killed while saving (1.5 s)
  assert ("the launcher received SIGTERM: SIGTERM to every process, SIGKILL after 30 s (--grace); "
          "rank(s) 0, 1 were preempted") in out and "exiting with code 75" in out, out


def test_a_rank_that_does_not_save_in_time_is_killed_after_grace():
  run = _Running(["--processes", "2", "--grace", "1", "--", "-c", SAVES_ON_SIGTERM], IGNORE_RANK="1")
  run.wait_for(["[rank0]: up", "[rank1]: up"])
  t0 = time.monotonic()
  run.proc.send_signal(signal.SIGTERM)
  out = run.finish()
  assert run.proc.returncode == 128 + signal.SIGTERM, out
  assert time.monotonic() - t0 < 30
  assert "rank 1 was killed by signal SIGKILL" in out and "[rank0]: saved" in out, out


def test_ranks_preempted_on_their_own_end_the_launch_with_75():
  # Each rank gets SIGTERM itself (as every task of a SLURM job step does), rank 1 a second
  # later: rank 0's exit with 75 is no failure, so rank 1 is left to save too.
  res, _, _ = _launch(["--processes", "2", "--grace", "30", "--", "-c", SAVES_ON_SIGTERM],
                      SELF_TERM="0,1")
  assert res.returncode == 75, res.stderr
  assert "[rank0]: saved" in res.stdout and "[rank1]: saved" in res.stdout, res.stdout
  assert "rank(s) 0, 1 were preempted" in res.stderr and "received" not in res.stderr, res.stderr


# Every run of a rank appends it to RUNS. Rank 1, once rank 0's run has too, fails in the
# n-th way of DIES in its n-th run (kill: SIGKILL by itself; else that exit code), then succeeds.
DIES_UNTIL_DONE = """
import os, signal, sys, time
rank = os.environ["JAXCOMP_PROCESS_ID"]
with open(os.environ["RUNS"], "a") as f:
  f.write(rank + "\\n")
runs = lambda r: open(os.environ["RUNS"]).read().split().count(r)
while rank == "1" and runs("0") < runs("1"):
  time.sleep(0.01)
for i, way in enumerate(os.environ["DIES"].split(",")):
  mark = os.environ["RUNS"] + f".died{i}"
  if rank == "1" and way and not os.path.exists(mark):
    open(mark, "w").close()
    if way == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(way))
print("done", flush=True)
"""


def _checkpoints(root):
  """Steps 2 and 4 sealed (experiments.seals), then step 4's file of process 1 changed."""
  from experiments import seals
  for step in (2, 4):
    part = root / str(step) / "default" / "ocdbt.process_1"
    part.mkdir(parents=True)
    (part / "data").write_bytes(b"shards of step %d" % step)
    seals.seal(str(root / str(step)))
  (root / "4" / "default" / "ocdbt.process_1" / "data").write_bytes(b"shards of step 5")
  return root


def test_max_restarts_starts_every_process_again_and_says_from_which_step(tmp_path):
  runs, ckpt = tmp_path / "runs", _checkpoints(tmp_path / "ckpt")
  res, _, _ = _launch(["--processes", "2", "--max-restarts", "2", "--checkpoints", str(ckpt), "--",
                       "-c", DIES_UNTIL_DONE], RUNS=str(runs), DIES="kill,3")
  assert res.returncode == 0, res.stderr
  assert sorted(runs.read_text().split()) == ["0", "0", "0", "1", "1", "1"]  # three runs of both
  said = [line for line in res.stderr.splitlines() if line.startswith("[launch]")]
  where = f"resuming from step 2 (the newest checkpoint in {ckpt} that every process has completely)"
  assert said[0].startswith("[launch] rank 1 was killed by signal SIGKILL (9)"), said
  assert said[0].endswith(f"; restart 1 of 2: {where}"), said
  assert said[1].startswith("[launch] rank 1 exited with code 3") and said[1].endswith(f"restart 2 of 2: {where}")
  assert len(said) == 2 and res.stdout.count("[rank1]: done") == 1, res.stdout


def test_max_restarts_spent_exits_with_the_last_failures_code(tmp_path):
  res, _, _ = _launch(["--processes", "2", "--max-restarts", "1", "--", "-c", DIES_UNTIL_DONE, "--workdir",
                       str(tmp_path / "none")], RUNS=str(tmp_path / "runs"), DIES="kill,3,4")
  assert res.returncode == 3, res.stderr
  said = [line for line in res.stderr.splitlines() if line.startswith("[launch]")]
  assert said[0].endswith(f"restart 1 of 1: starting from step 0 (no checkpoint in "
                          f"{tmp_path / 'none' / 'checkpoints'} that every process has completely)"), said
  assert said[1:] == ["[launch] rank 1 exited with code 3; exiting with code 3"], said


def test_preemption_is_not_restarted():
  res, _, _ = _launch(["--processes", "2", "--max-restarts", "3", "--grace", "30", "--", "-c",
                       SAVES_ON_SIGTERM], SELF_TERM="0,1")
  assert res.returncode == 75, res.stderr
  assert "restart" not in res.stderr and res.stdout.count("up") == 2, res.stderr


def test_timeout_no_output_ends_a_silent_run():
  res, seconds, _ = _launch(["--processes", "2", "--timeout-no-output", "1", "--",
                             "-c", "import time; time.sleep(300)"])
  assert res.returncode == 1, res.stderr
  assert seconds < 60
  assert "no process wrote a line for 1 s" in res.stderr and "ended rank(s) 0, 1" in res.stderr


@pytest.mark.slow
def test_link_benchmark_over_loopback(tmp_path):
  # One size: each (method, size) is a compile in each process, and a size's workload and programs are
  # built afresh (benchmarks.link.worker); TernGrad's count at several sizes: tests/test_terngrad.py.
  out = tmp_path / "link.json"
  res = subprocess.run([sys.executable, "-m", "benchmarks.link", "--processes", "2", "--n", "4096",
                        "--methods", "none,terngrad,terngrad:exchange='two_phase'", "--trials", "1", "--warmup", "1",
                        "--heartbeat-timeout", "60", "--json", str(out)], cwd=REPO, env=_env(), capture_output=True, text=True,
                       timeout=120)
  assert res.returncode == 0, res.stdout + res.stderr
  doc = json.loads(out.read_text())
  assert doc["processes"] == 2 and doc["latency_s"] > 0
  wire = {(r["method"], r["n"]): r["bytes_on_wire"] for r in doc["results"]}
  two_phase = "terngrad:exchange='two_phase'"
  assert set(wire) == {(m, 4096) for m in ("none", "terngrad", two_phase)}
  assert wire["none", 4096] == 4 * 4096  # float32
  assert 4096 // 4 <= wire["terngrad", 4096] < 4096 // 2  # 2-bit codes and a few scalars
  # A routed exchange's received bytes are recorded too: the plan's count, as under vmap.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jaxcomp  # pylint: disable=g-import-not-at-top
  from jaxcomp import parallel  # pylint: disable=g-import-not-at-top
  received = {r["n"]: r["received_bytes"] for r in doc["results"] if r["method"] == two_phase}
  tx = jaxcomp.terngrad(axis_name="w", exchange="two_phase")
  for n, got in received.items():
    g = jnp.asarray(np.random.default_rng(0).standard_normal((2, n)), jnp.float32)
    state = parallel.replicate_workers(tx.init(g[0]), 2)
    _, s2 = jax.vmap(tx.update, in_axes=(0, parallel.worker_axes(state)), axis_name="w")(g, state)
    assert got == int(jaxcomp.metrics(parallel.worker_slice(s2, 0))["received_bytes"])


def test_heartbeat_timeout_from_env_shortens_a_survivors_wait(tmp_path):
  # No launcher: the survivor of a SIGKILLed peer fails its gloo collective at
  # once, then hangs until the coordination service declares the peer dead
  # (JAX's default heartbeat timeout: 100 s). JAXCOMP_HEARTBEAT_TIMEOUT=5
  # through initialize_from_env must end it far sooner.
  port = supervisor._free_port()
  t0 = time.monotonic()
  procs = [subprocess.Popen([sys.executable, "-c", COLLECTIVE_LOOP], cwd=REPO,
                            env=_env(KILL_AT="10", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                     JAXCOMP_NUM_PROCESSES="2", JAXCOMP_PROCESS_ID=str(i),
                                     JAXCOMP_HEARTBEAT_TIMEOUT="5"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    out0 = procs[0].communicate(timeout=60)[0]
  finally:
    for p in procs:
      p.kill()
      p.wait()
  assert procs[1].returncode == -signal.SIGKILL
  assert "step 10 psum 2.0" in out0, out0
  assert procs[0].returncode != 0
  assert time.monotonic() - t0 < 50, out0[-2000:]


def test_launch_env_reads_and_checks_the_variables():
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAXCOMP_NUM_PROCESSES": "4",
         "JAXCOMP_PROCESS_ID": "3", "JAXCOMP_HEARTBEAT_TIMEOUT": "7"}
  assert distributed.launch_env(env) == distributed.LaunchEnv("10.0.0.1:1234", 4, 3, 7, None, None)
  assert distributed.launch_env({}) is None
  for bad, match in (({"JAXCOMP_PROCESS_ID": "4"}, "must be below"),
                     ({"JAXCOMP_PROCESS_ID": ""}, "is not"),
                     ({"JAXCOMP_NUM_PROCESSES": "two"}, "not an integer"),
                     ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1"}, "HOST:PORT"),
                     ({"JAXCOMP_HEARTBEAT_TIMEOUT": "0"}, "at least 1")):
    with pytest.raises(ValueError, match=match):
      distributed.launch_env({**env, **bad})
  assert not distributed.initialize_from_env()  # this test process is not launched


def test_children_get_huge_pages_unless_told_not_to():
  assert procenv.with_huge_pages({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  assert procenv.with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  assert procenv.with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == (
      "glibc.malloc.hugetlb=0")  # the user's own setting wins
  assert "GLIBC_TUNABLES" not in procenv.with_huge_pages({"JAXCOMP_HUGE_PAGES": "0"})
  show = "import os; print('tunables', os.environ.get('GLIBC_TUNABLES'))"
  res, _, _ = _launch(["--processes", "2", "--", "-c", show], GLIBC_TUNABLES="")
  assert res.returncode == 0, res.stderr
  for r in range(2):
    assert f"[rank{r}]: tunables glibc.malloc.hugetlb=1" in res.stdout, res.stdout
  res, _, _ = _launch(["--processes", "1", "--", "-c", show], GLIBC_TUNABLES="", JAXCOMP_HUGE_PAGES="0")
  assert res.returncode == 0 and "[rank0]: tunables" in res.stdout and "hugetlb" not in res.stdout, res.stdout


def test_bad_arguments_are_clear(capsys):
  with pytest.raises(SystemExit):
    launch.main(["--processes", "2"])
  assert "no program: put it after --" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    launch.main(["--processes", "2", "--link", "100mb", "--", "-c", "pass"])
  assert "RATE must be" in capsys.readouterr().err
  assert netns.parse_link("1gbit,5ms") == netns.LinkSpec("1gbit", "5ms")
  assert netns.parse_link("10mbps") == netns.LinkSpec("10mbps", None)
  with pytest.raises(netns.LaunchError, match="DELAY"):
    netns.parse_link("100mbit,5")


def test_link_without_root_or_iproute2_is_a_clear_error(monkeypatch, capsys):
  argv = ["--processes", "2", "--link", "100mbit", "--", "-c", "pass"]
  monkeypatch.setattr(netns, "_euid", lambda: 1000)
  assert launch.main(argv) == 2
  assert "--link needs root" in capsys.readouterr().err
  monkeypatch.setattr(netns, "_euid", lambda: 0)
  monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
  assert launch.main(argv) == 2
  assert "needs iproute2" in capsys.readouterr().err


# --------------------------------------------------------------------------- --link

needs_link = pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")),
    reason="--link needs root and iproute2 (ip, tc)")


def _left_behind(pid):
  """This launch's namespaces, links and /etc/netns entries that still exist."""
  tag = f"jaxc{pid}"
  netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
  etc = os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []
  return ([line for line in netns.splitlines() if tag in line]
          + [line for line in links.splitlines() if tag in line]
          + [name for name in etc if name.startswith(tag)])


@needs_link
def test_link_psum_across_namespaces_leaves_nothing():
  code = ("import socket; print('address', socket.gethostbyname(socket.gethostname()), flush=True)\n"
          "from experiments.distributed import _self_check; raise SystemExit(_self_check())\n")
  res, _, pid = _launch(["--processes", "2", "--link", "100mbit", "--", "-c", code])
  assert res.returncode == 0, res.stdout + res.stderr
  for r in range(2):  # each process in its own namespace, with its own address
    assert f"[rank{r}]: address 10.213.0.{r + 1}" in res.stdout
    assert f"[rank{r}]: process {r} of 2 (1 local devices, 2 in all): psum 3, expected 3: ok" in res.stdout
  assert _left_behind(pid) == []


@needs_link
def test_link_failure_leaves_nothing():
  code = "import os, sys; sys.exit(3 if os.environ['JAXCOMP_PROCESS_ID'] == '1' else 0)"
  res, _, pid = _launch(["--processes", "3", "--link", "1gbit", "--", "-c", code])
  assert res.returncode == 3 and "rank 1 exited with code 3" in res.stderr, res.stderr
  assert _left_behind(pid) == []


@needs_link
def test_link_delay_runs_or_says_netem_is_missing():
  res, _, pid = _launch(["--processes", "2", "--link", "100mbit,2ms", "--", "-c", "print('ran')"])
  if res.returncode == 0:
    assert res.stdout.count("ran") == 2
  else:  # kernels without sch_netem (e.g. some VMs)
    assert res.returncode == 2 and "no netem qdisc" in res.stderr, res.stderr
  assert _left_behind(pid) == []


@needs_link
def test_link_down_mid_run_ends_the_run():
  run = _Running(["--processes", "2", "--link", "1gbit", "--link-timeout", "2", "--grace", "2",
                  "--", "-c", COLLECTIVE_LOOP])
  run.wait_for(["[rank0]: step 10", "[rank1]: step 10"])
  t0 = time.monotonic()
  subprocess.run(["ip", "-n", f"jaxc{run.proc.pid}r1", "link", "set", "eth0", "down"], check=True)
  out = run.finish()
  assert run.proc.returncode == 1, out
  assert time.monotonic() - t0 < 60
  assert f"the link of rank 1 (veth jaxc{run.proc.pid}h1" in out and "has been down" in out, out
  assert _left_behind(run.proc.pid) == []


@needs_link
def test_sigterm_to_the_launcher_cleans_up():
  run = _Running(["--processes", "2", "--link", "1gbit", "--grace", "2", "--",
                  "-c", "import time; print('up', flush=True); time.sleep(300)"])
  run.wait_for(["[rank0]: up", "[rank1]: up"])
  assert _left_behind(run.proc.pid) != []
  run.proc.send_signal(signal.SIGTERM)
  out = run.finish()
  assert run.proc.returncode == 128 + signal.SIGTERM, out
  assert "received SIGTERM" in out
  assert _left_behind(run.proc.pid) == []


@needs_link
def test_cleanup_removes_what_a_killed_launcher_left():
  run = _Running(["--processes", "2", "--link", "1gbit", "--",
                  "-c", "import time; print('up', flush=True); time.sleep(300)"])
  run.wait_for(["[rank0]: up", "[rank1]: up"])
  pid = run.proc.pid
  run.proc.kill()  # no chance to clean up; its children die with it (parent-death signal)
  run.finish()
  assert _left_behind(pid) != []
  end = time.monotonic() + 20
  while time.monotonic() < end and any(
      subprocess.run(["ip", "netns", "pids", f"jaxc{pid}r{r}"], capture_output=True,
                     text=True).stdout.strip() for r in range(2)):
    time.sleep(0.1)
  for r in range(2):
    assert subprocess.run(["ip", "netns", "pids", f"jaxc{pid}r{r}"], capture_output=True,
                          text=True).stdout.strip() == ""
  res, _, _ = _launch(["--cleanup"])
  assert res.returncode == 0, res.stderr
  assert f"jaxc{pid}r0" in res.stderr
  assert _left_behind(pid) == []
