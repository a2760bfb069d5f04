"""Test set-up: 8 host CPU devices for the multi-device tests.

XLA reads XLA_FLAGS once, when JAX first initialises its backend, so this has
to happen before anything imports jax.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# The 8 devices' collectives meet in a rendezvous that XLA:CPU aborts the whole
# process on after a termination timeout. On a loaded 2-core machine (two pytest
# workers and other jobs) a participant's thread can be starved that long: a
# test_layouts_agree worker died by SIGABRT that way with no Python error. A
# longer limit lets a slow rendezvous finish; a real deadlock still ends.
_TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds"
if _TIMEOUT not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += f" {_TIMEOUT}=180"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def pytest_configure(config):
  """A compilation cache for this pytest process, so tests that build the same step reuse it.

  Many tests compile identical programs (a training step of the same config,
  the same exchange in several layouts); JAX's persistent cache keys a
  compiled program by its HLO, flags and devices, so a repeat is loaded, not
  compiled (programs that took at least a second to compile, JAX's default).
  Set through jax.config, not the environment: the processes that tests start
  (multi-process training, the launcher) keep compiling on their own.
  """
  del config
  import atexit  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  cache = tempfile.mkdtemp(prefix="jaxcomp-tests-xla-cache-")
  atexit.register(shutil.rmtree, cache, True)
  jax.config.update("jax_compilation_cache_dir", cache)
