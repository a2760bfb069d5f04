"""Runs a command with a time limit; past it, shows what is running, then ends it.

Usage: python3 .ci/deadline.py [--grace SECONDS] SECONDS COMMAND [ARG...]

The command runs in a session of its own. If it still runs after SECONDS,
the session's processes are listed, every one that handles SIGUSR1 is sent it
in turn (the pytest processes: tests/conftest.py makes each write every
thread's stack and the tests it is running), and after the grace
period (10 s) they are sent SIGTERM, then SIGKILL. Exits with the command's
status, or 124 (as coreutils' timeout) when the limit ended it. Standard
library only: .ci/run calls it with the system's python3.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time


def _session(sid):
  """The live processes of session ``sid``: {pid: (ppid, command line)}."""
  found = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = f.read().rsplit(")", 1)[1].split()
      with open(f"/proc/{name}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
      continue  # gone meanwhile
    if int(fields[3]) == sid and fields[0] != "Z":
      found[int(name)] = (int(fields[1]), cmdline)
  return found


def _handles(pid, signum):
  """Whether process ``pid`` has a handler for ``signum`` (the SigCgt mask of /proc/PID/status)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("SigCgt:"):
          return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
  except OSError:
    pass
  return False


def _signal_all(pids, signum):
  for pid in pids:
    try:
      os.kill(pid, signum)
    except ProcessLookupError:
      pass


def _say(text):
  print(f"deadline.py: {text}", flush=True)


def _end(proc, limit, grace):
  """Shows what the session of ``proc`` is running, then ends every process of it."""
  _say(f"{shlex.join(proc.args)} still runs after {limit:g} s; its processes:")
  processes = _session(proc.pid)
  for pid, (ppid, cmdline) in sorted(processes.items()):
    print(f"  {pid:>7} (parent {ppid:>7})  {cmdline[:200]}", flush=True)
  reporting = [pid for pid in processes if _handles(pid, signal.SIGUSR1)]
  _say(f"SIGUSR1 to {reporting or 'none'} (every thread's stack, the running tests)")
  for pid in reporting:  # one at a time: their reports share the terminal
    _signal_all([pid], signal.SIGUSR1)
    time.sleep(1)
  time.sleep(grace)
  for signum in (signal.SIGTERM, signal.SIGKILL):
    _say(f"{signal.Signals(signum).name} to the session's processes")
    _signal_all(_session(proc.pid), signum)
    end = time.monotonic() + grace
    while time.monotonic() < end:
      proc.poll()  # reaps the command itself
      if not _session(proc.pid):
        return
      time.sleep(0.2)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--grace", type=float, default=10, help="seconds between the report and each signal")
  parser.add_argument("seconds", type=float, help="the time limit")
  parser.add_argument("command", nargs=argparse.REMAINDER)
  args = parser.parse_args()
  proc = subprocess.Popen(args.command, start_new_session=True)
  try:
    status = proc.wait(timeout=args.seconds)
    return status if status >= 0 else 128 - status  # killed by a signal: as a shell says
  except subprocess.TimeoutExpired:
    _end(proc, args.seconds, args.grace)
    _say(f"failed: over the time limit of {args.seconds:g} s")
    return 124


if __name__ == "__main__":
  sys.exit(main())
