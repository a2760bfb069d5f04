"""The launcher's emulated links: one network namespace per rank, veth pairs to a
bridge, links shaped with ``tc``, and the removal of what launches leave behind.

Also the launcher's errors (:class:`LaunchError`) and its own messages
(:func:`say`). ``python -m experiments.launch`` (its module docstring) says
what ``--link`` and ``--cleanup`` do for a user; this module is how.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from typing import NamedTuple, Sequence

PREFIX = "jaxc"
SUBNET = "10.213.0"  # rank r is SUBNET.(r+1); each launch has its own isolated bridge
NETNS_ETC = "/etc/netns"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)(?:r\d+|br|h\d+|n\d+)$")
_RATE_RE = re.compile(r"^\d+(\.\d+)?([kmgt]?(bit|bps))$", re.IGNORECASE)
_DELAY_RE = re.compile(r"^\d+(\.\d+)?(s|ms|us)$", re.IGNORECASE)


class LaunchError(Exception):
  """A problem the user can fix (bad arguments, no root, no iproute2...)."""


def say(msg: str) -> None:
  print(f"[launch] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- link specs


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
      say("removed leftovers of launches no longer running: " + "; ".join(
          f"{kinds[k]} {', '.join(v)}" for k, v in stale.items() if v))
    for problem in problems:
      say(f"could not remove: {problem}")
  elif verbose:
    say("no leftovers of earlier launches")
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

