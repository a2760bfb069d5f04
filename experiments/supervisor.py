"""The launcher's processes: the group of P processes with their rank-prefixed
output, how each run ends (:class:`Outcome`), and the :class:`Supervisor` that
watches a run and starts it again after a failure (``--max-restarts``).

``python -m experiments.launch`` (its module docstring) says what a user sees:
the environment, failures, restarts, preemption and exit codes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, NamedTuple

from experiments import distributed
from experiments import procenv
from experiments import restarts
from experiments.netns import LaunchError, Topology, say
from experiments.preemption import PREEMPTED_EXIT_CODE

_POLL = 0.05  # seconds between checks of the processes and links
FAILURE_GRACE = 5.0  # seconds at most between SIGTERM and SIGKILL for the survivors of a failure
_LINE_RE = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")
_PR_SET_PDEATHSIG = 1
_libc = None


def _die_with_parent() -> None:
  """Runs in the child before exec: SIGKILL it when the launcher dies, whatever the cause."""
  if _libc is not None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(rank: int, args: argparse.Namespace, coordinator: str) -> dict[str, str]:
  env = dict(os.environ)
  env.update({
      distributed.COORDINATOR_ENV: coordinator,
      distributed.NUM_PROCESSES_ENV: str(args.processes),
      distributed.PROCESS_ID_ENV: str(rank),
      distributed.HEARTBEAT_TIMEOUT_ENV: str(args.heartbeat_timeout),
      distributed.SHUTDOWN_TIMEOUT_ENV: str(args.shutdown_timeout),
      "PYTHONUNBUFFERED": "1",
  })
  env.pop("JAXCOMP_LINK", None)
  if args.link is not None:
    env["JAXCOMP_LINK"] = args.link.rate + (f",{args.link.delay}" if args.link.delay else "")
  return procenv.with_huge_pages(env)  # CPU: about 2x faster steps (experiments/procenv.py)


class Outcome(NamedTuple):
  code: int          # the launcher's exit code
  message: str | None  # why the run ended early (None: every process exited 0)
  failed: bool = False  # a process or link failed, or the run hung: --max-restarts restarts it


class Group:
  """The P processes, their output pumps, and the means to end them."""

  def __init__(self, procs: list[subprocess.Popen]):
    self.procs = procs
    self.last_output = time.monotonic()
    self._lock = threading.Lock()
    self._pumps = []
    for rank, proc in enumerate(procs):
      for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
        t = threading.Thread(target=self._pump, args=(rank, pipe, out), daemon=True)
        t.start()
        self._pumps.append(t)

  def _pump(self, rank: int, pipe: IO[bytes], out: IO[str]) -> None:
    """Re-prints every line of ``pipe`` with the rank in front.

    A line ends at ``\n`` or at a lone ``\r`` (kept), so progress bars that
    redraw one line with ``\r`` still redraw it, prefix included.
    """
    prefix = f"[rank{rank}]: ".encode()
    pending, after_cr = b"", False
    while True:
      chunk = pipe.read1(1 << 16)
      pending += chunk
      lines = _LINE_RE.findall(pending)
      done = sum(map(len, lines))
      if not chunk and done < len(pending):
        lines.append(pending[done:] + b"\n")  # the last line, unterminated
        done = len(pending)
      pending = pending[done:]
      if lines:
        # A \r\n split between two reads: its \n just ends the line already shown.
        head = [lines.pop(0)] if after_cr and lines[0] == b"\n" else []
        # A bare \r (tqdm starts each redraw with one) takes no prefix of its own:
        # the text after it does, so a captured log shows one prefix per redraw.
        self._write(out, b"".join(head + [line if line == b"\r" else prefix + line
                                          for line in lines]))
        after_cr = (head + lines)[-1].endswith(b"\r")
      if not chunk:
        break
    pipe.close()

  def _write(self, out: IO[str], data: bytes) -> None:
    with self._lock:
      self.last_output = time.monotonic()
      try:
        if hasattr(out, "buffer"):
          out.buffer.write(data)
        else:  # a text-only stream (e.g. replaced by a test harness)
          out.write(data.decode(errors="replace"))
        out.flush()
      except (OSError, ValueError):  # our own output closed: keep draining the pipe
        pass

  def drain(self, timeout: float = 2.0) -> None:
    """Waits (briefly) for the pumps to print what the processes wrote last."""
    end = time.monotonic() + timeout
    for t in self._pumps:
      t.join(max(0.0, end - time.monotonic()))

  def signal_all(self, sig: int) -> None:
    for proc in self.procs:
      try:
        os.killpg(proc.pid, sig)  # each child leads its own process group
      except (ProcessLookupError, PermissionError):
        pass

  def end(self, grace: float) -> None:
    """SIGTERM to every process group still running, SIGKILL after ``grace`` seconds."""
    if any(p.poll() is None for p in self.procs):
      self.signal_all(signal.SIGTERM)
      deadline = time.monotonic() + grace
      while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
        time.sleep(_POLL)
    self.signal_all(signal.SIGKILL)  # stragglers, and anything the processes left behind
    for p in self.procs:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        pass


def start_processes(args: argparse.Namespace, program: list[str],
                    topology: Topology | None) -> Group:
  global _libc
  if _libc is None and sys.platform.startswith("linux"):
    _libc = ctypes.CDLL(None, use_errno=True)
  port = args.port or _free_port()
  host = topology.addresses[0] if topology else "127.0.0.1"
  procs = []
  try:
    for rank in range(args.processes):
      cmd = [sys.executable] + program
      if topology is not None:
        cmd = ["ip", "netns", "exec", topology.netns[rank]] + cmd
      procs.append(subprocess.Popen(
          cmd, env=child_env(rank, args, f"{host}:{port}"), stdin=subprocess.DEVNULL,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
          preexec_fn=_die_with_parent))
  except OSError as e:
    Group(procs).end(0)
    raise LaunchError(f"cannot start rank {len(procs)}: {e}") from e
  # The pumps (threads) start only now: preexec_fn is unsafe while other threads run.
  return Group(procs)


def describe_exit(rank: int, returncode: int) -> str:
  if returncode < 0:
    sig = -returncode
    try:
      name = signal.Signals(sig).name
    except ValueError:
      name = f"signal {sig}"
    text = f"rank {rank} was killed by signal {name} ({sig})"
    if sig == signal.SIGKILL:
      text += " (from outside the process: `kill -9`, the out-of-memory killer...)"
    elif sig == signal.SIGABRT:
      text += (" (JAX aborts so when its coordination service loses a peer, e.g. after the "
               "heartbeat timeout: see the rank's last lines)")
    return text
  return f"rank {rank} exited with code {returncode}"


def _exit_code(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode


def ranks_text(ranks) -> str:
  return ", ".join(map(str, ranks))


def preempted_outcome(ranks: list[int]) -> Outcome:
  """Every process exited 0 or 75, and ``ranks`` with 75: preempted, a checkpoint saved."""
  return Outcome(PREEMPTED_EXIT_CODE,
                 f"rank(s) {ranks_text(ranks)} were preempted: they finished their step, saved a "
                 f"checkpoint and exited with code {PREEMPTED_EXIT_CODE}; run the same command "
                 "again to resume")


def after_stop(outcome: Outcome, group: Group) -> Outcome:
  """The outcome of a launch the launcher was told to stop, once its processes have ended.

  If every process saved and exited 75 (or had exited 0), the launch was
  preempted cleanly: exit 75. Otherwise ``outcome`` (128 + the signal),
  naming the processes that did not.
  """
  codes = {r: p.returncode for r, p in enumerate(group.procs)}
  preempted = sorted(r for r, code in codes.items() if code == PREEMPTED_EXIT_CODE)
  others = [r for r, code in codes.items() if code not in (0, PREEMPTED_EXIT_CODE)]
  if preempted and not others:
    stopped = preempted_outcome(preempted)
    return stopped._replace(message=f"{outcome.message}; {stopped.message}")
  return outcome._replace(message="; ".join(
      [outcome.message] + [f"rank {r} did not end" if codes[r] is None else describe_exit(r, codes[r])
                           for r in others]))


class Stop:
  """Set by SIGINT/SIGTERM/SIGHUP: the supervising loop ends the run."""
  signum: int | None = None


def on_signal(signum, frame):  # pylint: disable=unused-argument
  if Stop.signum is None:
    Stop.signum = signum


class Supervisor:
  """Watches one launch: the launcher's signals, the processes, the links, the output."""

  def __init__(self, group: Group, args: argparse.Namespace, topology: Topology | None):
    self.group, self.args, self.topology = group, args, topology
    self.exited: dict[int, int] = {}
    self.down_since: dict[int, float] = {}
    self.preempted_at: float | None = None  # when the first process exited with code 75

  def run(self) -> Outcome:
    """Waits for every process to exit 0, or for the first reason to end the run."""
    while True:
      outcome = (self.check_signal() or self.check_exits() or self.check_links()
                 or self.check_output())
      if outcome is not None:
        return outcome
      time.sleep(_POLL)

  def check_signal(self) -> Outcome | None:
    if Stop.signum is None:
      return None
    name = signal.Signals(Stop.signum).name
    return Outcome(128 + Stop.signum,
                   f"the launcher received {name}: SIGTERM to every process, SIGKILL after "
                   f"{self.args.grace:g} s (--grace)")

  def check_exits(self) -> Outcome | None:
    """The first process to fail (exit code or signal), or the end when all exited 0 or 75.

    Code 75 (preempted: a checkpoint was saved) is no failure: the others are
    waited for, ``--grace`` seconds at most.
    """
    now = time.monotonic()
    new = {r: p.returncode for r, p in enumerate(self.group.procs)
           if r not in self.exited and p.poll() is not None}
    self.exited.update(new)
    failed = sorted(r for r, code in new.items() if code not in (0, PREEMPTED_EXIT_CODE))
    if failed:
      # Several seen in one poll: a signal death is more likely the cause than an exit code.
      first = min(failed, key=lambda r: (new[r] > 0, r))
      msg = "; ".join([describe_exit(first, new[first])]
                      + [describe_exit(r, new[r]) for r in failed if r != first])
      down = self.topology.down_links() if self.topology is not None else []
      if down:
        msg += f"; the link of rank(s) {', '.join(map(str, down))} was down at the time"
      return Outcome(_exit_code(new[first]), msg, failed=True)
    preempted = sorted(r for r, code in self.exited.items() if code == PREEMPTED_EXIT_CODE)
    if len(self.exited) == len(self.group.procs):
      return preempted_outcome(preempted) if preempted else Outcome(0, None)
    if preempted:
      self.preempted_at = self.preempted_at or now
      if now - self.preempted_at >= self.args.grace:
        running = [r for r in range(len(self.group.procs)) if r not in self.exited]
        return Outcome(1, f"rank(s) {ranks_text(running)} still running {self.args.grace:g} s "
                          f"(--grace) after rank(s) {ranks_text(preempted)} exited with code "
                          f"{PREEMPTED_EXIT_CODE} (preempted)")
    return None

  def check_links(self) -> Outcome | None:
    """A link down for --link-timeout seconds."""
    if self.topology is None:
      return None
    now, down = time.monotonic(), self.topology.down_links()
    self.down_since = {r: self.down_since.get(r, now) for r in down}
    late = [r for r, t in self.down_since.items() if now - t >= self.args.link_timeout]
    if not late:
      return None
    r = min(late)
    if len(late) == self.topology.processes and not self.topology.link_up(self.topology.bridge):
      return Outcome(1, f"the bridge {self.topology.bridge} has been down for "
                        f"{now - self.down_since[r]:.0f} s (--link-timeout "
                        f"{self.args.link_timeout:g}): ending the run", failed=True)
    return Outcome(1, f"the link of rank {r} (veth {self.topology.host_ends[r]}, namespace "
                      f"{self.topology.netns[r]}) has been down for "
                      f"{now - self.down_since[r]:.0f} s (--link-timeout "
                      f"{self.args.link_timeout:g}): ending the run", failed=True)

  def check_output(self) -> Outcome | None:
    """No line from any process for --timeout-no-output seconds."""
    limit = self.args.timeout_no_output
    if not limit or time.monotonic() - self.group.last_output < limit:
      return None
    return Outcome(1, f"no process wrote a line for {limit:g} s (--timeout-no-output): "
                      "ending the run as hung", failed=True)


def supervise(args: argparse.Namespace, program: list[str], topology: Topology | None,
              started: list[Group]) -> Outcome:
  """Starts the processes and watches them, starting them all again after a failure
  (``--max-restarts``); each group is appended to ``started`` as it starts."""
  group = None
  for restart in range(args.max_restarts + 1):
    if Stop.signum is not None:
      return Outcome(128 + Stop.signum, "the launcher received a signal during set-up"
                     if group is None else "the launcher received a signal before a restart")
    if group is not None:
      ended = [r for r, p in enumerate(group.procs) if p.poll() is None]
      group.end(min(args.grace, FAILURE_GRACE))
      group.drain()
      where = restarts.resume_point(restarts.checkpoint_dir(program, args.checkpoints), args.processes)
      say(f"{outcome.message}" + (f"; ended rank(s) {ranks_text(ended)}" if ended else "")
           + f"; restart {restart} of {args.max_restarts}: {where}")
    group = start_processes(args, program, topology)
    started.append(group)
    outcome = Supervisor(group, args, topology).run()
    if not outcome.failed:
      break
  return outcome

