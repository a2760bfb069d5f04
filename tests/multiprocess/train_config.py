"""The tiny training run the multi-process training tests share (worker and test process).

LeNet on the 5,000 real MNIST digits (``mnist5k``), 8 workers x 4 examples,
a few steps, a checkpoint at the end (its arrays are what the tests compare).
"""

import ml_collections

from configs import terngrad_lenet

# compressor name -> its arguments: TernGrad (stochastic, scalar sharing; its float
# reduce-scatter inside a host) and 1-bit SGD (error feedback: a worker-local residual).
# Float across processes: tests/test_multiprocess.py (DiLoCo's float pseudo-gradients) and
# tests/test_launch.py.
COMPRESSORS = {
    "terngrad": {"clip_sigma": 2.5},
    "onebit": {},
}
# TernGrad runs hierarchically: 2 hosts of 4 devices (config.hosts), a process each in the
# 2-process run, the 8 devices of one process in the other.
HOSTS = {"terngrad": 2}
STEPS = 4


def config(compressor: str, steps: int = STEPS, checkpoint_every: int = STEPS,
           heartbeat: int = 100) -> ml_collections.ConfigDict:
  c = terngrad_lenet.get_config("runlocal,dataset=mnist5k")
  c.workers = 8
  c.batch_size = 32
  c.num_train_steps = steps
  c.log_every = 2
  c.eval_every = 0
  c.eval_batch_size = 500
  c.checkpoint_every = checkpoint_every
  c.progress = False
  c.compressor = compressor
  c.compressor_kwargs = ml_collections.ConfigDict(COMPRESSORS[compressor])
  c.hosts = HOSTS.get(compressor, 0)
  c.distributed.heartbeat_timeout_seconds = heartbeat
  return c
