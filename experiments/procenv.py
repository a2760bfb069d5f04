"""The environment of the Python processes that the launcher and sweeps start.

:func:`with_huge_pages` asks glibc for transparent huge pages for large
allocations (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``). XLA:CPU allocates a
step's temporaries afresh on every call, and with 4 KiB pages the first
touch of each one faults: with simulated workers tens of thousands of faults
per step. With huge pages training steps on CPU run about twice as fast,
float and compressed alike (docs/benchmarks.md, "Training-step time with
simulated workers"). It is a CPU-side setting only: device memory on GPU and
TPU does not go through malloc, so there it changes nothing. glibc reads it
from 2.35 on (older ones ignore unknown tunables), and the kernel must allow
transparent huge pages (``madvise`` or ``always`` in
``/sys/kernel/mm/transparent_hugepage/enabled``). ``JAXCOMP_HUGE_PAGES=0``
keeps the plain allocator, and a ``GLIBC_TUNABLES`` that already sets
``glibc.malloc.hugetlb`` is left as it is.
"""

from __future__ import annotations

from typing import Mapping

HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT_ENV = "JAXCOMP_HUGE_PAGES"


def with_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
  """A copy of ``env`` whose ``GLIBC_TUNABLES`` also asks for huge pages (see the module docstring)."""
  env = dict(env)
  tunables = env.get("GLIBC_TUNABLES", "")
  if env.get(OPT_OUT_ENV, "1") == "0" or "glibc.malloc.hugetlb" in tunables:
    return env
  env["GLIBC_TUNABLES"] = ":".join(filter(None, [tunables, HUGE_PAGES_TUNABLE]))
  return env
