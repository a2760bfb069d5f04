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
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, NamedTuple, Sequence

from experiments import distributed
from experiments import procenv
from experiments import restarts
from experiments.preemption import PREEMPTED_EXIT_CODE

PREFIX = "jaxc"
SUBNET = "10.213.0"  # rank r is SUBNET.(r+1); each launch has its own isolated bridge
NETNS_ETC = "/etc/netns"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)(?:r\d+|br|h\d+|n\d+)$")
_RATE_RE = re.compile(r"^\d+(\.\d+)?([kmgt]?(bit|bps))$", re.IGNORECASE)
_DELAY_RE = re.compile(r"^\d+(\.\d+)?(s|ms|us)$", re.IGNORECASE)
_POLL = 0.05  # seconds between checks of the processes and links
FAILURE_GRACE = 5.0  # seconds at most between SIGTERM and SIGKILL for the survivors of a failure
_LINE_RE = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")


class LaunchError(Exception):
  """A problem the user can fix (bad arguments, no root, no iproute2...)."""


def _say(msg: str) -> None:
  print(f"[launch] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- arguments


class LinkSpec(NamedTuple):
  rate: str
  delay: str | None


def parse_link(text: str) -> LinkSpec:
  """Parses ``RATE[,DELAY]`` (tc units), e.g. ``100mbit`` or ``1gbit,5ms``."""
  rate, _, delay = text.partition(",")
  rate, delay = rate.strip(), delay.strip() or None
  if not _RATE_RE.match(rate):
    raise LaunchError(f"--link {text!r}: RATE must be a number and a tc rate unit such as "
                      "100mbit, 1gbit, 500kbit or 10mbps (bytes/s).")
  if delay is not None and not _DELAY_RE.match(delay):
    raise LaunchError(f"--link {text!r}: DELAY must be a number and s, ms or us, e.g. 5ms.")
  return LinkSpec(rate, delay)


def tbf_burst(rate: str) -> int:
  """The tbf's bucket in bytes: what may pass at once, above RATE, after an idle spell.

  A NIC sends nothing faster than its line rate, so the bucket is kept small:
  96 KiB or 1 ms at RATE, whichever is larger. A large bucket lets the first
  bytes after every idle spell through for free (256 KiB let a 10 Mbit/s link
  move a 450 KB all-reduce in well under its wire time); one smaller than a
  64 KB segment (TCP segmentation offload) costs throughput instead (32 KiB:
  an 8 MB all-gather at 100 Mbit/s took 0.90 s, 96 KiB 0.73 s, against 0.64 s
  of wire time).
  """
  return max(96 * 1024, int(rate_bits_per_second(rate) / 8 / 1000))


def rate_bits_per_second(rate: str) -> float:
  """A tc RATE (``100mbit``, ``10mbps`` = bytes/s) in bit/s."""
  m = re.match(r"^(\d+(?:\.\d+)?)([kmgt]?)(bit|bps)$", rate, re.IGNORECASE)
  value, scale, unit = float(m.group(1)), m.group(2).lower(), m.group(3).lower()
  value *= {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[scale]
  return value * (8 if unit == "bps" else 1)


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
  args = p.parse_args(own)
  if args.cleanup:
    if program or args.processes is not None:
      p.error("--cleanup takes no program and no --processes")
    return args, program
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
  try:
    args.link = parse_link(args.link) if args.link is not None else None
    _check_program(program)
  except LaunchError as e:
    p.error(str(e))
  return args, program


# --------------------------------------------------------------------------- namespaces


def _euid() -> int:
  return os.geteuid()


def require_link_support(what: str = "--link") -> None:
  """Raises LaunchError unless this process can build namespaces and shape links."""
  if _euid() != 0:
    raise LaunchError(f"{what} needs root: --link creates network namespaces, veth pairs, a bridge "
                      "and tc qdiscs, and writes /etc/netns. Run as root (e.g. sudo), or drop "
                      "--link to run over loopback.")
  missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
  if missing:
    raise LaunchError(f"{what} needs iproute2 (the `ip` and `tc` commands); not found: "
                      f"{', '.join(missing)}. Install it, e.g. `apt-get install iproute2`.")


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
  res = subprocess.run(list(cmd), capture_output=True, text=True, stdin=subprocess.DEVNULL)
  if check and res.returncode != 0:
    raise LaunchError(f"`{' '.join(cmd)}` failed: {(res.stderr or res.stdout).strip()}")
  return res


def _netns_names() -> list[str]:
  out = _run(["ip", "netns", "list"], check=False).stdout
  return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
  return sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []


def _etc_names() -> list[str]:
  return sorted(os.listdir(NETNS_ETC)) if os.path.isdir(NETNS_ETC) else []


def launch_objects(pid: int | None = None) -> dict[str, list[str]]:
  """Namespaces, links and /etc/netns entries of launches (of one launcher pid if given)."""
  def mine(name):
    m = _NAME_RE.match(name)
    return bool(m) and (pid is None or int(m.group(1)) == pid)
  return {"netns": [n for n in _netns_names() if mine(n)],
          "links": [n for n in _link_names() if mine(n)],
          "etc": [n for n in _etc_names() if mine(n)]}


def _remove_objects(objs: dict[str, list[str]]) -> list[str]:
  """Ends what still runs in the namespaces, then removes links, namespaces, hosts files.

  Returns the problems met (never raises: it runs on every exit path).
  """
  problems = []
  for ns in objs["netns"]:
    for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
      try:
        os.kill(int(pid), signal.SIGKILL)
      except (ProcessLookupError, ValueError):
        pass
  for link in sorted(objs["links"], key=lambda n: n.endswith("br")):  # veths, then the bridge
    if os.path.exists(f"/sys/class/net/{link}"):
      res = _run(["ip", "link", "del", link], check=False)
      if res.returncode != 0 and os.path.exists(f"/sys/class/net/{link}"):
        problems.append(f"ip link del {link}: {res.stderr.strip()}")
  for ns in objs["netns"]:
    res = _run(["ip", "netns", "del", ns], check=False)
    if res.returncode != 0 and ns in _netns_names():
      problems.append(f"ip netns del {ns}: {res.stderr.strip()}")
  for name in objs["etc"]:
    try:
      shutil.rmtree(os.path.join(NETNS_ETC, name))
    except OSError as e:
      problems.append(f"rm -r {NETNS_ETC}/{name}: {e}")
  try:
    if os.path.isdir(NETNS_ETC) and not os.listdir(NETNS_ETC):
      os.rmdir(NETNS_ETC)
  except OSError:
    pass
  return problems


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def cleanup_leftovers(verbose: bool = True) -> int:
  """Removes the objects of launches whose launcher is no longer running.

  Returns:
    The number of objects removed.
  """
  objs = launch_objects()
  stale = {k: [n for n in v if not _alive(int(_NAME_RE.match(n).group(1)))]
           for k, v in objs.items()}
  count = sum(len(v) for v in stale.values())
  if count:
    problems = _remove_objects(stale)
    if verbose or count:
      kinds = {"netns": "namespaces", "links": "links", "etc": NETNS_ETC}
      _say("removed leftovers of launches no longer running: " + "; ".join(
          f"{kinds[k]} {', '.join(v)}" for k, v in stale.items() if v))
    for problem in problems:
      _say(f"could not remove: {problem}")
  elif verbose:
    _say("no leftovers of earlier launches")
  return count


class Topology:
  """One network namespace per rank, veth pairs to one bridge, tc-shaped links."""

  def __init__(self, pid: int, processes: int, link: LinkSpec):
    self.pid, self.processes, self.link = pid, processes, link
    self.tag = f"{PREFIX}{pid}"
    self.bridge = f"{self.tag}br"
    self.netns = [f"{self.tag}r{r}" for r in range(processes)]
    self.host_ends = [f"{self.tag}h{r}" for r in range(processes)]
    self.addresses = [f"{SUBNET}.{r + 1}" for r in range(processes)]

  def create(self) -> None:
    """Builds the namespaces and links; on error the caller's remove() undoes it."""
    _remove_objects(launch_objects(self.pid))  # a dead launch's leftovers with our (reused) pid
    _run(["ip", "link", "add", self.bridge, "type", "bridge"])
    _run(["ip", "link", "set", self.bridge, "up"])
    for rank in range(self.processes):
      self._add_rank(rank)

  def _add_rank(self, rank: int) -> None:
    ns, host, addr = self.netns[rank], self.host_ends[rank], self.addresses[rank]
    peer = f"{self.tag}n{rank}"
    _run(["ip", "netns", "add", ns])
    self._write_hosts(ns, addr)
    _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer])
    _run(["ip", "link", "set", peer, "netns", ns])
    _run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
    _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    _run(["ip", "link", "set", host, "master", self.bridge])
    _run(["ip", "link", "set", host, "up"])
    self._shape(ns, host)

  @staticmethod
  def _write_hosts(ns: str, addr: str) -> None:
    os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
    with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
      f.write(f"127.0.0.1\tlocalhost\n{addr}\t{socket.gethostname()}\n"
              "::1\tlocalhost ip6-localhost ip6-loopback\n")

  def _tbf(self) -> list[str]:
    return ["tbf", "rate", self.link.rate, "burst", str(tbf_burst(self.link.rate)), "latency", "50ms"]

  def _shape(self, ns: str, host: str) -> None:
    """RATE both ways (a tbf on each veth end); DELAY on what the namespace sends."""
    _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:"] + self._tbf())
    _run(["tc", "qdisc", "add", "dev", host, "root", "handle", "1:"] + self._tbf())
    if self.link.delay is not None:
      # netem as the tbf's child (Mininet's TCLink recipe); a large limit so the
      # delayed packets in flight (RATE x DELAY) are never dropped by netem.
      res = _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:",
                  "netem", "delay", self.link.delay, "limit", "100000"], check=False)
      if res.returncode != 0:
        hint = (" This kernel has no netem qdisc (module sch_netem): load it "
                "(`modprobe sch_netem`) or drop ,DELAY from --link."
                if "unknown" in res.stderr.lower() else "")
        raise LaunchError(f"cannot add DELAY {self.link.delay}: {res.stderr.strip().rstrip('.')}.{hint}")

  @staticmethod
  def link_up(name: str) -> bool:
    """Whether a link of the host's namespace is up (and, for a veth, its peer too)."""
    try:
      with open(f"/sys/class/net/{name}/operstate") as f:
        return f.read().strip() == "up"
    except OSError:
      return False

  def down_links(self) -> list[int]:
    """Ranks whose link is not up (a veth end down or without carrier, or the bridge down)."""
    if not self.link_up(self.bridge):
      return list(range(self.processes))
    return [r for r, host in enumerate(self.host_ends) if not self.link_up(host)]

  def remove(self) -> list[str]:
    return _remove_objects(launch_objects(self.pid))


# --------------------------------------------------------------------------- processes


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


def _ranks(ranks) -> str:
  return ", ".join(map(str, ranks))


def preempted_outcome(ranks: list[int]) -> Outcome:
  """Every process exited 0 or 75, and ``ranks`` with 75: preempted, a checkpoint saved."""
  return Outcome(PREEMPTED_EXIT_CODE,
                 f"rank(s) {_ranks(ranks)} were preempted: they finished their step, saved a "
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


class _Stop:
  """Set by SIGINT/SIGTERM/SIGHUP: the supervising loop ends the run."""
  signum: int | None = None


def _on_signal(signum, frame):  # pylint: disable=unused-argument
  if _Stop.signum is None:
    _Stop.signum = signum


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
    if _Stop.signum is None:
      return None
    name = signal.Signals(_Stop.signum).name
    return Outcome(128 + _Stop.signum,
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
        return Outcome(1, f"rank(s) {_ranks(running)} still running {self.args.grace:g} s "
                          f"(--grace) after rank(s) {_ranks(preempted)} exited with code "
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
      _say(f"could not remove: {problem}")
  return ended


def _supervise(args: argparse.Namespace, program: list[str], topology: Topology | None,
               started: list[Group]) -> Outcome:
  """Starts the processes and watches them, starting them all again after a failure
  (``--max-restarts``); each group is appended to ``started`` as it starts."""
  group = None
  for restart in range(args.max_restarts + 1):
    if _Stop.signum is not None:
      return Outcome(128 + _Stop.signum, "the launcher received a signal during set-up"
                     if group is None else "the launcher received a signal before a restart")
    if group is not None:
      ended = [r for r, p in enumerate(group.procs) if p.poll() is None]
      group.end(min(args.grace, FAILURE_GRACE))
      group.drain()
      where = restarts.resume_point(restarts.checkpoint_dir(program, args.checkpoints), args.processes)
      _say(f"{outcome.message}" + (f"; ended rank(s) {_ranks(ended)}" if ended else "")
           + f"; restart {restart} of {args.max_restarts}: {where}")
    group = start_processes(args, program, topology)
    started.append(group)
    outcome = Supervisor(group, args, topology).run()
    if not outcome.failed:
      break
  return outcome


def run(args: argparse.Namespace, program: list[str]) -> int:
  """Sets up, starts, supervises and tears down one launch; returns the exit code."""
  topology, started = None, []
  try:
    if args.link is not None:
      require_link_support()
      cleanup_leftovers(verbose=False)
      topology = Topology(os.getpid(), args.processes, args.link)
      topology.create()
    outcome = _supervise(args, program, topology, started)
  finally:
    # Told to stop (preemption), the processes get --grace seconds to save; after a
    # failure, no more than FAILURE_GRACE (they cannot save without the failed one).
    group = started[-1] if started else None
    stopped = _Stop.signum is not None
    ended = _teardown(group, topology, args.grace if stopped else min(args.grace, FAILURE_GRACE))
  if stopped and group is not None:
    outcome = after_stop(outcome, group)
  elif ended and outcome.message is not None:
    outcome = outcome._replace(message=f"{outcome.message}; ended rank(s) {_ranks(ended)}")
  if outcome.message is not None:
    _say(f"{outcome.message}; exiting with code {outcome.code}")
  return outcome.code


def main(argv: Sequence[str] | None = None) -> int:
  args, program = parse_args(sys.argv[1:] if argv is None else argv)
  if args.cleanup:
    try:
      require_link_support("--cleanup")
    except LaunchError as e:
      _say(f"error: {e}")
      return 2
    cleanup_leftovers()
    return 0
  _Stop.signum = None
  previous = {sig: signal.signal(sig, _on_signal)
              for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
  try:
    return run(args, program)
  except LaunchError as e:
    _say(f"error: {e}")
    return 2
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


if __name__ == "__main__":
  sys.exit(main())
