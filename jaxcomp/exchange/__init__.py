"""The exchange core: how one update's gradients travel between workers.

:func:`jaxcomp.compress` (jaxcomp/compress_update.py) makes a plan of the update
and hands every tensor's exchange to the transport. The modules, in the order
a gradient meets them:

* :mod:`~jaxcomp.exchange.plan`: which tensors go in which bucket and by which
  algorithm (all-gather or two-phase), and the bytes each would move, read
  off the same messages the transport counts;
* :mod:`~jaxcomp.exchange.hierarchy`: the topology of a host of several
  devices (float within it, compressed between hosts);
* :mod:`~jaxcomp.exchange.allgather` and :mod:`~jaxcomp.exchange.two_phase`:
  the algorithms, generators of :class:`~jaxcomp.core.Message` s;
* :mod:`~jaxcomp.exchange.layout`: a bucket's tensors side by side, for
  compressors that encode a bucket at once;
* :mod:`~jaxcomp.exchange.transport`: runs the messages, one collective each
  or fused per bucket (:mod:`~jaxcomp.exchange.buckets`), and counts every
  byte it moves: the only place that counts bytes for the metrics.

Nothing is imported here: the modules import :mod:`jaxcomp.core`, which
imports :mod:`~jaxcomp.exchange.layout`.
"""
