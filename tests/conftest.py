"""Test set-up: 8 host CPU devices for the multi-device tests, faster compiles; a suite that never hangs.

XLA reads XLA_FLAGS once, when JAX first initialises its backend, so this has
to happen before anything imports jax.

Time limits (pyproject.toml sets pytest-timeout's per-test limit, .ci/deadline.py
the whole run's): a test over its limit has its name and every thread's stack
written to the terminal, then its process exits. Under pytest-xdist that
process is a worker, whose stdout is not the terminal (pytest-timeout's own
report would be lost), so the report goes to a copy of stderr taken here; the
controller then reports the test as crashed and, with ``--max-worker-restart=0``
(Makefile), stops the run instead of running it again in a new worker. SIGUSR1
(sent by .ci/deadline.py when the whole run is over its limit) makes every
pytest process write every thread's stack and the tests it is running.
"""

import faulthandler
import os
import signal
import threading
import time

import pytest

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# The 8 devices' collectives meet in a rendezvous that XLA:CPU aborts the whole
# process on after a termination timeout (40 s by default). A participant starved
# on a loaded 2-core machine still arrives within the longer limit; a deadlock
# (docs/design.md, "Host devices") ends in SIGABRT (`pytest -s` shows XLA's log). The tests'
# subprocesses get the longer limit too (_processes.worker_xla_flags).
_TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds"
if _TIMEOUT not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += f" {_TIMEOUT}=180"
# This process compiles thousands of small programs (a backend compile takes about half of
# its time): XLA:CPU's classic emitters compile them faster than its default fusion emitters.
# A code-generation choice of XLA:CPU alone, after the same HLO passes (GPUs and TPUs have back
# ends of their own), but it rounds differently: the multi-process tests' workers, compared with
# this process bit for bit, get it too, and so do the subprocesses that run the README and the
# docs' pages, multi-process training, sweeps and the zoo, which compile much of what the
# suite's run takes (_processes.worker_xla_flags). The launcher's tests run theirs with defaults.
_EMITTERS = "--xla_cpu_use_fusion_emitters"
if _EMITTERS not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += f" {_EMITTERS}=false"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_CACHE_ENV = "JAXCOMP_TESTS_XLA_CACHE"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow (the tf.data pipelines) imports Keras at its own import: about 2 s of CPU in this
# process and in every subprocess that reads images (most of the suite's training runs). Nothing
# here uses Keras. Told to use the legacy tf_keras, which is not installed, TensorFlow skips it.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# Hypothesis profiles that --hypothesis-profile loads (it needs them registered before the test
# modules are imported): "exchange-long" runs tests/test_exchange_fuzz.py's property long.
from hypothesis import HealthCheck, settings  # pylint: disable=g-import-not-at-top,wrong-import-position

settings.register_profile("exchange-long", max_examples=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def pytest_configure(config):
  """Reports of time limits (below), the files of long tests first, and one compilation cache
  for the run's pytest processes.

  Many tests compile identical programs (a training step of the same config,
  the same exchange in several layouts); JAX's persistent cache keys a
  compiled program by its HLO, flags and devices, so a repeat is loaded, not
  compiled (programs that took at least a second to compile, JAX's default).
  Set through jax.config, not JAX's environment variable: the processes that tests start
  (multi-process training, the launcher) keep compiling on their own
  (``tests/test_multiprocess_train.py`` gives its workers a cache of their own).
  """
  _report_time_limits(config)
  _long_files_first(config)
  import atexit  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  # One cache for the whole run: the controller makes it before xdist starts its workers,
  # which find it in their environment (files of one worker often compile what the
  # other's did: the training step of a tiny config, an exchange in the same layout).
  cache = os.environ.get(_CACHE_ENV)
  if not cache:
    cache = tempfile.mkdtemp(prefix="jaxcomp-tests-xla-cache-")
    os.environ[_CACHE_ENV] = cache
    atexit.register(shutil.rmtree, cache, True)
  jax.config.update("jax_compilation_cache_dir", cache)


def _long_files_first(config):
  """Keeps the collection's order of files for pytest-xdist (``pytest_collection_modifyitems``
  puts the files with a test marked ``slow`` first).

  Under ``--dist loadfile`` a worker runs a file whole, and takes the next one when it is
  done. xdist's default order, the most tests first, leaves the files of a few long tests
  (subprocesses training a config) to the end, where one worker runs the last of them while
  the other has nothing left; started first, they end while the short files still fill both.
  """
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
  """The files with a test marked ``slow`` first, each file's tests together and in order."""
  del session, config
  slow = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.path not in slow)  # a stable sort: files keep their order


# Where the reports of time limits go: a copy of the process's stderr, taken in
# pytest_configure (output capturing is suspended then), so that neither
# capturing nor an xdist worker's redirected stdout swallows them.
_report = None
# The tests this process runs now, by node id, with their start times. In an
# xdist controller these are the tests the workers run.
_running = {}


def _write(text):
  _report.write(text)
  _report.flush()


def _write_running(signum=None, frame=None):
  """Writes the tests this process is running and for how long (a SIGUSR1 handler)."""
  del signum, frame
  now = time.monotonic()
  lines = [f"  {nodeid} (running for {now - start:.0f} s)\n" for nodeid, start in list(_running.items())]
  _write(f"pytest process {os.getpid()}: tests running now:\n" + ("".join(lines) or "  none\n"))


def _report_time_limits(config):
  """Opens the report stream and makes SIGUSR1 write every thread's stack and the running tests."""
  global _report
  _report = os.fdopen(os.dup(2), "w", buffering=1)
  # faulthandler writes the stacks from its C signal handler, even while the
  # main thread is blocked in XLA, then chains to the Python handler, which
  # runs once the main thread executes Python again.
  signal.signal(signal.SIGUSR1, _write_running)
  faulthandler.register(signal.SIGUSR1, file=_report, all_threads=True, chain=True)

  def restore():
    faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    _report.close()

  config.add_cleanup(restore)


def pytest_runtest_logstart(nodeid, location):
  del location
  _running[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
  del location
  _running.pop(nodeid, None)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
  """An xdist worker died while running ``crashitem``: it runs no more."""
  del report, sched
  _running.pop(crashitem, None)


def _time_out(item, seconds):
  """Names the test, writes every thread's stack and ends this process (pytest-timeout's thread method)."""
  _write(f"\n{'+' * 30} Timeout {'+' * 30}\n{item.nodeid} ran longer than its {seconds:g} s limit "
         f"(process {os.getpid()}); every thread's stack, the test's in the main thread:\n")
  faulthandler.dump_traceback(file=_report, all_threads=True)
  _write(f"{'+' * 69}\n")
  os._exit(1)  # pylint: disable=protected-access


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item, settings):
  """Starts the timer of pytest-timeout's ``thread`` method, reporting to the terminal."""
  if settings.method != "thread":
    return None  # pytest-timeout's own
  timer = threading.Timer(settings.timeout, _time_out, (item, settings.timeout))
  timer.name = f"timeout {item.nodeid}"
  timer.daemon = True
  timer.start()
  item.cancel_timeout = timer.cancel  # what pytest-timeout calls when the test ends
  return True
