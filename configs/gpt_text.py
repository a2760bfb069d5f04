r"""A GPT-style language model on real English text: no paper's experiment, jaxcomp's own.

This config reproduces no paper: it is the language-model workload on which the compressors
and DiLoCo (``jaxcomp.diloco``) are compared, in GPT-2's layout (Radford et al. 2019) with a
recipe of the usual kind for small GPTs (nanoGPT-like: AdamW with decoupled weight decay 0.1 on
the matrices, β2 = 0.95, linear warm-up then cosine decay to a tenth, gradients clipped to norm
1), chosen by us, not taken from a paper.

The data: the GCIDE dictionary's English text from Debian's ``dict-gcide`` (GPL-2+; 31.8 MB
after removing indentation and source-tag lines; 30.3 MB train, 1.6 MB held out; see
``jaxcomp.data.text``), byte-level tokens. The baseline to beat: the unigram entropy of the
train bytes, 4.874 bits per byte (4.876 on the held-out bytes).

Commands::

  # under 5 minutes on 2 CPU cores (4 simulated workers, float32 exchange):
  python -m experiments.train --config configs/gpt_text.py:runlocal --workdir /tmp/gpt_text
  # the same with a compressor, or with DiLoCo (AdamW inside, H = 8 local steps, Nesterov outside):
  python -m experiments.train --config configs/gpt_text.py:runlocal --workdir /tmp/gpt_int8 \
      --config.compressor=int8
  python -m experiments.train --config configs/gpt_text.py:runlocal,diloco --workdir /tmp/gpt_diloco

Measured (``:runlocal``, seed 0, float32 exchange, this project's 2-core machine): held-out
**2.529 bits per byte** after 1,000 steps (loss 1.753 nats per byte, next-byte accuracy 47.6%),
against the unigram baseline of 4.874. ``make lm`` took 4 min 5 s in all (221 s of training
steps), timed idle on 2026-11-28: nothing else ran on the two cores (load average under 1 at
the start). With a test suite beside it, 4 min 41 s.
``:runlocal,diloco`` (H = 8, float32 pseudo-gradients, outer Nesterov SGD lr 0.7): **2.887** bits
per byte after the same 1,000 steps (3.343 at step 500), with 421,248 bytes per worker per step
on average, exactly an eighth of the float32 all-reduce's 3,369,984 (20.6 minutes, shared machine).

The default (no argument) is the 3.3M-parameter ``gpt`` at context 256, 8 workers, total batch
64 windows, 20,000 steps; ``model=gpt2_small`` gives GPT-2 small's 124M parameters (context
1024, for machines with accelerators). ``:runlocal`` is a 0.8M-parameter model at context 128,
4 workers, 1,000 steps of 32 windows (4.1M bytes seen).
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, allowed=("runlocal", "diloco", "model"))
  c = common.base_config()
  c.experiment = "GPT-TEXT"
  c.dataset = "gcide"
  c.model = args.get("model", "gpt")
  c.seq_len = 1024 if c.model == "gpt2_small" else 256
  c.workers = 8
  c.batch_size = 64
  c.num_train_steps = 20_000
  c.optimizer = "adamw"
  c.learning_rate = 1e-3
  c.adam_b2 = 0.95
  c.weight_decay = 0.1
  c.weight_decay_mode = "decoupled"
  c.weight_decay_pattern = "(kernel|embedding|position)$"  # matrices; not biases or layer norms
  c.lr_schedule = "cosine"
  c.lr_warmup_steps = 500
  c.lr_end = 1e-4
  c.grad_clip_norm = 1.0
  c.compressor = "none"
  c.skip_batch_norm = False  # no batch norm in a Transformer
  c.eval_windows = 1024
  c.eval_batch_size = 64
  c.eval_every = 2000
  c.log_every = 100
  if "runlocal" in args:
    c.model_kwargs = ml_collections.ConfigDict({"context": 128, "width": 128, "depth": 4, "heads": 4})
    c.seq_len = 128
    c.workers = 4
    c.batch_size = 32
    c.num_train_steps = 1000
    c.learning_rate = 3e-3
    c.lr_warmup_steps = 50
    c.lr_end = 3e-4
    c.eval_windows = 512
    c.eval_every = 250
    c.log_every = 50
  if "diloco" in args:
    # DiLoCo (arXiv:2311.08105, Alg. 1): the AdamW above runs H local steps per worker; the
    # pseudo-gradients are averaged (float32) and applied by SGD with Nesterov momentum 0.9, lr 0.7.
    c.compressor = "diloco"
    c.compressor_kwargs = ml_collections.ConfigDict({"inner_steps": 8, "outer_learning_rate": 0.7,
                                                     "outer_momentum": 0.9})
  return c
