"""Settings that let MMEngine's own launchers and DDP run on CPU-only hosts.

MMEngine 0.10.7's ``init_dist('pytorch')`` calls ``torch.cuda.set_device``
and its default DDP wrapper passes ``device_ids=[LOCAL_RANK]``; both fail
without CUDA. On such a host we initialise the process group with the gloo
backend ourselves (the Runner then skips its own init) and ask for
``MMDistributedDataParallel`` with ``device_ids=None``, which is what DDP
wants for CPU modules. With CUDA nothing is changed.
"""
import os

import torch
import torch.distributed as torch_dist
from mmengine.config import Config


def prepare_cpu_distributed(cfg: Config, launcher: str) -> bool:
    """Adapt ``cfg`` and start the process group for CPU-only DDP.

    Args:
        cfg (Config): The full config; ``env_cfg`` and
            ``model_wrapper_cfg`` may be updated in place.
        launcher (str): ``'none'``, ``'pytorch'``, ``'slurm'`` or ``'mpi'``.

    Returns:
        bool: Whether the CPU path was taken.
    """
    if launcher == 'none' or torch.cuda.is_available():
        return False
    cfg.setdefault('env_cfg', {})
    cfg.env_cfg.setdefault('dist_cfg', {})
    cfg.env_cfg.dist_cfg['backend'] = 'gloo'
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    wrapper.setdefault('type', 'MMDistributedDataParallel')
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    if launcher == 'pytorch' and not torch_dist.is_initialized():
        torch_dist.init_process_group(
            backend='gloo',
            rank=int(os.environ['RANK']),
            world_size=int(os.environ['WORLD_SIZE']))
    return True


def finalize_distributed() -> None:
    """Tear the process group down before the interpreter exits.

    Left alive, gloo's threads can outlive Python's shutdown and abort a
    rank ("terminate called without an active exception") after training
    finished; torchrun then reports the whole job as failed.
    """
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()
