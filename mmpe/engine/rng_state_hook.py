"""Save and restore random-number-generator states with checkpoints.

MMEngine's resume restores weights, optimizer, schedulers and the message
hub, but not the RNG states, so random augmentation after a resume differs
from an uninterrupted run. This hook stores the states of Python's
``random``, numpy's global generator and torch's CPU (and CUDA) generators in
the checkpoint (as plain ints, floats and tensors: weights-only-safe) and
restores them on resume, so that a resumed run repeats the uninterrupted
run's losses exactly when data loading happens in the main process
(``num_workers=0``). Dataloader workers reseed themselves from the config's
seed, which this hook cannot reach.
"""
import random
from typing import Optional

import numpy as np
import torch
from mmengine.hooks import Hook

from mmdet.registry import HOOKS


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Put the RNG states into checkpoints and restore them on resume."""

    priority = 'VERY_LOW'
    KEY = 'rng_state'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        np_state = np.random.get_state()
        state = dict(
            python=list(random.getstate()[1]) + [random.getstate()[0]],
            python_gauss=random.getstate()[2],
            numpy=dict(
                keys=torch.from_numpy(np_state[1].astype(np.int64)),
                pos=int(np_state[2]),
                has_gauss=int(np_state[3]),
                cached_gaussian=float(np_state[4])),
            torch=torch.get_rng_state())
        if torch.cuda.is_available():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint[self.KEY] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state: Optional[dict] = checkpoint.get(self.KEY)
        if state is None:
            return
        *internal, version = state['python']
        random.setstate((int(version), tuple(int(v) for v in internal),
                         state['python_gauss']))
        np_state = state['numpy']
        np.random.set_state(
            ('MT19937', np_state['keys'].numpy().astype(np.uint32),
             np_state['pos'], np_state['has_gauss'],
             np_state['cached_gaussian']))
        torch.set_rng_state(state['torch'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])
