"""Starting the worker processes of the multi-process tests (jax.distributed on loopback)."""

import importlib.util
import os
import socket
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def load_multiprocess_module(name: str):
  """``tests/multiprocess/<name>.py`` as a module (the workers' scripts are files, not a package)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "multiprocess", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# conftest.py's XLA:CPU flags that a test's subprocesses take too.
_SAME_FLAGS = ("--xla_cpu_use_fusion_emitters", "--xla_cpu_collective_call_terminate_timeout_seconds")


def worker_xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test's subprocess: ``devices`` CPU devices, conftest.py's XLA:CPU emitters
  and its limit on a collective's rendezvous.

  The workers compile as this process does: their numbers are compared with this
  process's bit for bit (the emitters round differently), and the classic
  emitters compile faster. A device starved on a loaded machine still joins its
  devices' collective within the longer limit.
  """
  same = [f for f in os.environ.get("XLA_FLAGS", "").split() if f.startswith(_SAME_FLAGS)]
  return " ".join(([f"--xla_force_host_platform_device_count={devices}"] if devices > 1 else []) + same)


def compilation_cache_env(directory) -> dict:
  """Environment for subprocesses that share one compilation cache in ``directory``: every
  program cached (however short its compile), so a later process loads what an earlier compiled."""
  return {"JAX_COMPILATION_CACHE_DIR": str(directory), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def run_workers(script: str, num_processes: int, tmp_path, timeout: float = 300, args=(),
                devices: int = 1) -> list[dict]:
  """Runs ``tests/multiprocess/<script> PORT P RANK OUT.npz *args`` as P processes; returns their outputs.

  ``devices`` CPU devices per process; the workers import this checkout's
  ``jaxcomp``, whatever is installed. Fails with a worker's log if any exits non-zero.
  """
  port = str(free_port())
  path = os.pathsep.join(filter(None, [os.path.dirname(HERE), os.environ.get("PYTHONPATH")]))
  env = dict(os.environ, XLA_FLAGS=worker_xla_flags(devices), JAX_PLATFORMS="cpu", PYTHONPATH=path)
  procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multiprocess", script), port,
                             str(num_processes), str(i), str(tmp_path / f"out{i}.npz"), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(num_processes)]
  logs = [p.communicate(timeout=timeout)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  return [dict(np.load(tmp_path / f"out{i}.npz")) for i in range(num_processes)]
