"""Data-parallel training on Hugging Face accelerate, shared by the trainers.

A script that trains runs unchanged in one process or under ``accelerate launch`` (several GPUs or machines, with
DeepSpeed or FSDP when accelerate's config says so), and takes the same steps: a trainer's ``batch_size`` is the
examples of one optimiser step over all processes. Every process draws the batch's random choices alike (same
seed); each computes the losses of its share of the examples, weighted so that the gradients the engine averages
are those of the whole batch's mean loss. Losses that score an example against the batch's other examples gather
those vectors from every process with their gradients.
"""
import functools
from typing import Callable, List, NamedTuple, Optional

import numpy as np

from pyterrier_multiquery._extras import requires

with requires('dense'):
    import torch
    from torch import nn


class Share(NamedTuple):
    """This process's part of one (micro-)batch, given to a trainer's loss."""
    local: np.ndarray
    """Positions in the batch of the examples whose losses this process sums."""
    batch: np.ndarray
    """Positions of all the (micro-)batch's examples, over every process, in order."""
    gather: Callable[['torch.Tensor'], 'torch.Tensor']
    """Concatenates every process's rows of a tensor computed for ``local``, in batch order, keeping gradients."""


class _Objective(nn.Module):
    """A model whose forward is a batch's loss: what DDP, FSDP and DeepSpeed wrap, so that a loss that calls the
    model several times is one forward and one backward for them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, loss_of: Callable[[Share], 'torch.Tensor'], share: Share):
        return loss_of(share)


class DataParallel:
    """A model and its optimiser prepared by accelerate, and one optimiser step over a batch split across processes.

    In one process without mixed precision, the model and optimiser behave as they would unprepared (on the device
    asked for, else on accelerate's: a GPU when there is one).
    """

    def __init__(self, model: nn.Module, optimizer, *, device: Optional[str] = None,
                 mixed_precision: Optional[str] = None, gradient_accumulation_steps: int = 1):
        """
        Args:
            model: The module whose parameters train.
            optimizer: Its optimiser.
            device: Where the model trains, in one process (``accelerate launch`` gives each process its own);
                None for accelerate's device.
            mixed_precision: ``'no'``, ``'fp16'``, ``'bf16'`` or ``'fp8'``; None takes ``accelerate launch``'s setting.
            gradient_accumulation_steps: Micro-batches each batch is split into (one backward each, one optimiser
                step per batch), to fit a batch in memory. Losses with in-batch negatives then score each example
                against its micro-batch's examples only.
        """
        with requires('train'):
            from accelerate import Accelerator, DistributedDataParallelKwargs
        if gradient_accumulation_steps < 1:
            raise ValueError(f'gradient_accumulation_steps must be at least 1, got {gradient_accumulation_steps}')
        # the trainers' models have parts a loss may not use (a causal LM's head, an encoder's pooler)
        self.accelerator = Accelerator(mixed_precision=mixed_precision,
                                       gradient_accumulation_steps=gradient_accumulation_steps,
                                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
                                       device_placement=device is None,
                                       cpu=device is not None and torch.device(device).type == 'cpu')
        if device is not None and self.accelerator.num_processes > 1:
            raise ValueError(f'device={device!r} with {self.accelerator.num_processes} processes: accelerate launch '
                             'gives each process its device; leave device None')
        self.device = self.accelerator.device if device is None else torch.device(device)
        """This process's device."""
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.objective, self.optimizer = self.accelerator.prepare(_Objective(model.to(self.device)), optimizer)

    def step(self, count: int, loss_of: Callable[[Share], 'torch.Tensor'],
             denominator: Optional[float] = None) -> float:
        """One optimiser step over a batch of ``count`` examples.

        Args:
            count: Examples in the batch (over all processes).
            loss_of: The sum of the losses of a :class:`Share`'s ``local`` examples (a 0-d tensor).
            denominator: What the summed losses are divided by (default ``count``: the mean per example).

        Returns:
            The batch's loss: the sum over every process, divided by ``denominator``.
        """
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        steps = self.gradient_accumulation_steps
        denominator = count if denominator is None else denominator
        total = torch.zeros((), device=self.device)
        # micro-batches left empty (a batch smaller than the steps) come first: the last one, which syncs the
        # gradients across processes, has examples
        for micro in np.array_split(np.arange(count), steps)[::-1]:
            with self.accelerator.accumulate(self.objective):
                if len(micro):
                    shares = np.array_split(micro, processes)
                    local = shares[rank]
                    # a process without an example of its own runs the micro-batch's first (its loss weighted 0):
                    # every process takes part in each forward and backward
                    share = Share(local if len(local) else micro[:1], micro,
                                  functools.partial(_gather, sizes=[len(s) for s in shares], rank=rank))
                    loss = self.objective(loss_of, share)
                    self.accelerator.backward(loss * (processes * steps / denominator if len(local) else 0.))
                    total += loss.detach() if len(local) else 0.
                self.optimizer.step()
                self.optimizer.zero_grad()
        return float(self.accelerator.reduce(total, 'sum')) / denominator


def _gather(rows: 'torch.Tensor', sizes: List[int], rank: int) -> 'torch.Tensor':
    """Every process's ``rows`` (the first ``sizes[i]`` on process ``i``) concatenated, gradients flowing back to
    each process's own rows."""
    rows = rows[:sizes[rank]]
    if len(sizes) == 1:
        return rows
    with requires('dense'):
        import torch.distributed.nn.functional as dist
    padded = torch.zeros((max(sizes),) + rows.shape[1:], dtype=rows.dtype, device=rows.device)
    padded = torch.cat([rows, padded[len(rows):]])
    return torch.cat([part[:size] for part, size in zip(dist.all_gather(padded), sizes)])
