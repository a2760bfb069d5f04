r"""Start P local processes of one Python program, torchrun-style.

Usage::

  python -m experiments.launch --processes 2 -- -m experiments.distributed
  python -m experiments.launch --processes 4 --link 100mbit -- \
      -m experiments.train --config configs/terngrad_lenet.py --workdir /tmp/run
  python -m experiments.launch --processes 2 -- my_script.py --flag
  python -m experiments.launch --processes 2 -- -c "import jax; print(jax.__version__)"
  python -m experiments.launch --cleanup

Everything after ``--`` goes to the Python interpreter (``sys.executable``):
``-m module ...``, a script and its arguments, or ``-c CODE``. Every line a
process writes is re-printed with its rank, ``[rank1]: ...``, stdout to stdout
and stderr to stderr; a lone ``\r`` ends a line too, so progress bars redraw.

Environment. Each process gets its parent's environment plus

* ``JAX_COORDINATOR_ADDRESS``: ``HOST:PORT`` of rank 0 (read by JAX itself),
* ``JAXCOMP_NUM_PROCESSES`` and ``JAXCOMP_PROCESS_ID``: P and the rank,
* ``JAXCOMP_HEARTBEAT_TIMEOUT``, ``JAXCOMP_SHUTDOWN_TIMEOUT`` (seconds),
* ``JAXCOMP_LINK``: the ``--link`` argument, if any (for the run's records),
* ``PYTHONUNBUFFERED=1`` so lines arrive as they are written.

A program turns these into ``jax.distributed.initialize(...)`` by calling
``experiments.distributed.initialize_from_env()`` before it touches a device
(a no-op outside a launch; see that module).

Failures. The launcher watches its processes. When one exits with a non-zero
code or is killed by a signal, it sends SIGTERM to the others (their whole
process groups), SIGKILL after at most 5 s (``--grace``, if shorter; they
cannot save a checkpoint without the failed process), prints which rank
failed and how (``rank 1 was killed by signal SIGKILL (9)``) and exits
non-zero: the failed process's exit code, or 128 + the signal number. Without
the launcher, a survivor of a dead peer would wait for JAX's heartbeat
timeout (100 s by default) and then abort with a C++ stack trace; the
launcher also passes a shorter ``--heartbeat-timeout`` down.
``--timeout-no-output SECONDS`` ends a run in which no process has written a
line for that long (a hang). If the launcher itself is killed (SIGKILL), its
processes die with it (Linux parent-death signal).

Restarts. With ``--max-restarts K`` a failure (a process that exits
non-zero or is killed, a link down, a run without output) does not end the
launch: the others are ended as above and every process is started again,
up to K times; each run resumes from the newest checkpoint that every
process has completely (``experiments.train`` agrees on it,
:meth:`experiments.state.Checkpointer.restore`). One line says which rank
failed, how, and from which step the run resumes (the newest step whose
every part is as sealed in ``--checkpoints``, by default the program's
``--workdir``/checkpoints: :mod:`experiments.restarts`), e.g.
``rank 1 was killed by signal SIGKILL (9) ...; ended rank(s) 0; restart 1
of 3: resuming from step 200 (...)``. Once the K restarts are spent the
launcher exits with the last failure's code. Preemption (every process
exited 75 or 0) and a stopped launcher are not failures: never restarted.

Preemption. When the launcher receives SIGTERM (a SLURM time limit or
``scancel``, Kubernetes, a spot machine's notice; SIGINT and SIGHUP alike),
it sends SIGTERM to every process and gives them ``--grace`` seconds
(default 25, below the 30 s SLURM's ``KillWait`` and Kubernetes'
``terminationGracePeriodSeconds`` give by default) before SIGKILL.
``experiments.train`` uses them to finish its step, agree on it across the
processes (JAX's preemption sync point), save a checkpoint and exit with
code 75 (``experiments.preemption.PREEMPTED_EXIT_CODE``); when every process
did so, the launcher exits with 75 too: preempted, run the same command again
to resume. Processes that exit with 75 on their own (they received SIGTERM
directly, as every task of a SLURM job step does) are not failures either:
the launcher waits for the others, up to ``--grace`` seconds, and exits with
75. Under SLURM, run the launcher as the job step (``srun --ntasks=1``) or let
``srun`` start the processes itself (``experiments.distributed``); either way
each process gets SIGTERM and the same path applies.

Exit codes: 0 when every process exited 0; 75 when they were preempted and
saved (every one exited 75, or 0); the failed process's code or 128 + its
signal; 1 for a link down or a run without output; 128 + the signal when the
launcher is interrupted and its processes did not all save (143 for SIGTERM,
130 for Ctrl-C); 2 for the launcher's own errors (no root, no iproute2, a
namespace it could not build).

Emulated links (``--link RATE[,DELAY]``, needs root and iproute2). Every
process runs in its own network namespace (``ip netns exec``), attached by a
veth pair to one bridge. Each process's link is shaped with ``tc`` to RATE in
both directions (a ``tbf`` on each end, so a process sends and receives at
most RATE, like a full-duplex NIC), and with DELAY, one-way latency added to
what the process sends (a ``netem`` under the ``tbf``; needs the kernel's
``sch_netem``). RATE and DELAY use tc's units: ``100mbit``, ``1gbit``,
``10mbps`` (bytes/s); ``5ms``, ``200us``. Rank r has address 10.213.0.(r+1)
and rank 0's is the coordinator's. gloo binds to the address the host name
resolves to, so each namespace gets its own hosts file
(``/etc/netns/NAME/hosts``, which ``ip netns exec`` mounts over
``/etc/hosts``) mapping the host name to that namespace's address.

Names include the launcher's pid, so launches in parallel never collide:
namespaces ``jaxc<pid>r<rank>``, bridge ``jaxc<pid>br``, host-side veth ends
``jaxc<pid>h<rank>``, hosts files ``/etc/netns/jaxc<pid>r<rank>/``. They are
removed on every exit: success, failure, exception, SIGINT/SIGTERM/SIGHUP. A
launcher killed by SIGKILL cannot clean up; ``--cleanup`` removes what
launches no longer running left behind (every ``--link`` launch also does so
when it starts).

While a ``--link`` run goes on, the launcher watches the links: a link down
(either end of a veth pair, or the bridge) for ``--link-timeout`` seconds
ends the run with a message naming the rank whose link is down. Keep it below
``--heartbeat-timeout`` so that this message, not JAX's abort, names the cause.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Sequence

from experiments.netns import LaunchError, Topology, cleanup_leftovers, parse_link, require_link_support, say
from experiments.preemption import PREEMPTED_EXIT_CODE
from experiments.supervisor import FAILURE_GRACE, Group, Stop, after_stop, on_signal, ranks_text, supervise


# --------------------------------------------------------------------------- arguments


def _check_program(cmd: Sequence[str]) -> None:
  """Rejects an empty or obviously broken program early, with a clear message."""
  if not cmd:
    raise LaunchError("no program: put it after --, e.g. "
                      "`python -m experiments.launch --processes 2 -- -m experiments.distributed`.")
  if cmd[0] in ("-m", "-c") and len(cmd) < 2:
    raise LaunchError(f"`{cmd[0]}` after -- needs an argument (a module name or code).")
  if not cmd[0].startswith("-") and not os.path.exists(cmd[0]):
    raise LaunchError(f"script {cmd[0]!r} not found (after --, give `-m module`, "
                      "`-c CODE` or a script path).")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """Splits ``argv`` at the first ``--`` into launcher options and the program."""
  argv = list(argv)
  if "--" in argv:
    cut = argv.index("--")
    own, program = argv[:cut], argv[cut + 1:]
  else:
    own, program = argv, []
  p = _parser()
  args = p.parse_args(own)
  if args.cleanup:
    if program or args.processes is not None:
      p.error("--cleanup takes no program and no --processes")
    return args, program
  _check_args(p, args)
  try:
    args.link = parse_link(args.link) if args.link is not None else None
    _check_program(program)
  except LaunchError as e:
    p.error(str(e))
  return args, program


def _parser() -> argparse.ArgumentParser:
  """The launcher's own options (those before ``--``)."""
  p = argparse.ArgumentParser(
      prog="python -m experiments.launch",
      description="Start P local processes of a Python program with JAX's coordinator "
                  "environment; everything after -- goes to the interpreter.")
  p.add_argument("-n", "--processes", type=int, help="number of processes P")
  p.add_argument("--link", metavar="RATE[,DELAY]",
                 help="one network namespace per process, links shaped to RATE (and DELAY); "
                      "needs root and iproute2")
  p.add_argument("--port", type=int, default=0,
                 help="coordinator port on rank 0 (default: a free port)")
  p.add_argument("--heartbeat-timeout", type=int, default=30, metavar="S",
                 help="JAXCOMP_HEARTBEAT_TIMEOUT for the processes (default 30; JAX's own is 100)")
  p.add_argument("--shutdown-timeout", type=int, default=120, metavar="S",
                 help="JAXCOMP_SHUTDOWN_TIMEOUT for the processes (default 120)")
  p.add_argument("--grace", type=float, default=25.0, metavar="S",
                 help="seconds the processes get between the launcher's SIGTERM and its SIGKILL "
                      "when the launcher is stopped (SIGTERM, SIGINT, SIGHUP): time to finish "
                      "the step, save a checkpoint and exit with code "
                      f"{PREEMPTED_EXIT_CODE} (preempted; rerun to resume), which the launcher "
                      "then exits with; keep it below the scheduler's own grace period "
                      f"(default 25; after a process failed, the others get at most "
                      f"{FAILURE_GRACE:g})")
  p.add_argument("--link-timeout", type=float, default=10.0, metavar="S",
                 help="end a --link run whose link has been down this long (default 10)")
  p.add_argument("--timeout-no-output", type=float, default=0.0, metavar="S",
                 help="end the run if no process writes a line for S seconds (default 0: off)")
  p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                 help="after a failure (a process exits non-zero or is killed, a link down, no "
                      "output), start every process again, up to K times: each run resumes from "
                      "the newest checkpoint every process has completely (default 0)")
  p.add_argument("--checkpoints", metavar="DIR",
                 help="the checkpoint directory the restart line reads the step to resume from "
                      "(default: the program's --workdir, /checkpoints)")
  p.add_argument("--cleanup", action="store_true",
                 help="remove namespaces, links and hosts files left by launches that are no "
                      "longer running, then exit")
  return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
  """Rejects (``p.error``) the options of a launch that are out of range; warns of a risky pair."""
  if args.processes is None:
    p.error("--processes is required")
  if args.processes < 1:
    p.error(f"--processes must be at least 1, got {args.processes}")
  if args.link is not None and args.processes > 253:
    p.error(f"--link supports at most 253 processes (one /24), got {args.processes}")
  for name in ("grace", "link_timeout", "timeout_no_output", "max_restarts"):
    if getattr(args, name) < 0:
      p.error(f"--{name.replace('_', '-')} must not be negative")
  for name in ("heartbeat_timeout", "shutdown_timeout"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be at least 1")
  if not 0 <= args.port < 65536:
    p.error(f"--port {args.port} is not a port number")
  if args.link is not None and args.link_timeout >= args.heartbeat_timeout:
    print(f"warning: --link-timeout {args.link_timeout:g} is not below --heartbeat-timeout "
          f"{args.heartbeat_timeout}: JAX may abort on a link down before the launcher names it",
          file=sys.stderr)


# --------------------------------------------------------------------------- main


def _teardown(group: Group | None, topology: Topology | None, grace: float) -> list[int]:
  """Ends the processes still running, removes the namespaces; returns the ranks ended."""
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # let nothing cut teardown short
    signal.signal(sig, signal.SIG_IGN)
  ended = []
  if group is not None:
    ended = [r for r, p in enumerate(group.procs) if p.poll() is None]
    group.end(grace)
    group.drain()
  if topology is not None:
    for problem in topology.remove():
      say(f"could not remove: {problem}")
  return ended


def run(args: argparse.Namespace, program: list[str]) -> int:
  """Sets up, starts, supervises and tears down one launch; returns the exit code."""
  topology, started = None, []
  try:
    if args.link is not None:
      require_link_support()
      cleanup_leftovers(verbose=False)
      topology = Topology(os.getpid(), args.processes, args.link)
      topology.create()
    outcome = supervise(args, program, topology, started)
  finally:
    # Told to stop (preemption), the processes get --grace seconds to save; after a
    # failure, no more than FAILURE_GRACE (they cannot save without the failed one).
    group = started[-1] if started else None
    stopped = Stop.signum is not None
    ended = _teardown(group, topology, args.grace if stopped else min(args.grace, FAILURE_GRACE))
  if stopped and group is not None:
    outcome = after_stop(outcome, group)
  elif ended and outcome.message is not None:
    outcome = outcome._replace(message=f"{outcome.message}; ended rank(s) {ranks_text(ended)}")
  if outcome.message is not None:
    say(f"{outcome.message}; exiting with code {outcome.code}")
  return outcome.code


def main(argv: Sequence[str] | None = None) -> int:
  args, program = parse_args(sys.argv[1:] if argv is None else argv)
  if args.cleanup:
    try:
      require_link_support("--cleanup")
    except LaunchError as e:
      say(f"error: {e}")
      return 2
    cleanup_leftovers()
    return 0
  Stop.signum = None
  previous = {sig: signal.signal(sig, on_signal)
              for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
  try:
    return run(args, program)
  except LaunchError as e:
    say(f"error: {e}")
    return 2
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


if __name__ == "__main__":
  sys.exit(main())
