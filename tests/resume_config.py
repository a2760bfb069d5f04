"""The tiny run of ``tests/test_resume.py``, as a config file ``experiments.train`` reads too.

LeNet on the 5,000 real MNIST digits, 4 workers, TernGrad with error
feedback (worker-local residuals in the checkpoints), 16 steps: train rows
every 4 steps, checkpoints every 5, evaluations every 8.
"""

from configs import terngrad_lenet


def get_config():
  c = terngrad_lenet.get_config("runlocal,dataset=mnist5k")
  c.workers = 4
  c.num_train_steps = 16
  c.checkpoint_every = 5
  c.log_every = 4
  c.eval_every = 8
  c.eval_batch_size = 500
  c.progress = False
  c.compressor = "terngrad"
  c.compressor_kwargs = {"error_feedback": True}
  return c
