"""mmpe's runtime pieces in a config: what ``configs/_base_/runtime_mmpe.py``
declares and :func:`complete_runtime` puts into configs that lack it.

An MMEngine config may not set a key that two of its ``_base_`` files both
set, so a shared runtime base listed beside mmdet's or mmseg's
``default_runtime.py`` can declare only keys those leave alone:
``runner_type`` (:class:`~mmpe.engine.MMPERunner`) and ``custom_hooks``
(:data:`RUNTIME_HOOKS`). The two pieces that live under keys the stock bases
own, ``default_hooks.checkpoint`` and ``train_cfg``, are put in by
:func:`complete_runtime`, which ``MMPERunner.from_cfg`` runs on every config
(so mmdet's and mmseg's tools, ``mim train`` and mmpe's tools build the same
runner): MMEngine's ``CheckpointHook`` becomes
:class:`~mmpe.engine.AtomicCheckpointHook` and ``EpochBasedTrainLoop``
becomes :class:`~mmpe.engine.ResumableEpochBasedTrainLoop`, each with the
same arguments; a hook of :data:`RUNTIME_HOOKS` missing from
``custom_hooks`` (a config that replaced the base's list, or one without
the base) is appended, never a second copy.
"""
from typing import List, Tuple

from mmengine.config import Config

#: ``custom_hooks`` of every mmpe run, in the order of
#: ``configs/_base_/runtime_mmpe.py``: (name, names that count as it).
RUNTIME_HOOKS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('DatasetCheckHook', ('SegLabelCheckHook', )),
    ('PlainParamGroupsHook', ()),
    ('RNGStateHook', ()),
    ('PreemptionHook', ()),
    ('PlainCheckpointHook', ()),
)

#: What ``runner_type`` names in the runtime base.
RUNNER = 'MMPERunner'

#: Scopes whose registries hold mmpe's engine pieces under plain names
#: (mmseg's only when it is installed, see ``mmpe.seg``).
PLAIN_NAME_SCOPES = ('mmdet', 'mmseg')

#: MMEngine's classes and their mmpe subclasses (same arguments).
SUBCLASSES = (('CheckpointHook', 'AtomicCheckpointHook'),
              ('EpochBasedTrainLoop', 'ResumableEpochBasedTrainLoop'))


def type_name(entry) -> str:
    """The class name a hook entry (config dict or object) builds, without
    its scope (``'mmdet.PreemptionHook'`` -> ``'PreemptionHook'``)."""
    if isinstance(entry, dict):
        kind = entry.get('type', '')
        kind = kind if isinstance(kind, str) else kind.__name__
        return kind.split('.')[-1]
    return type(entry).__name__


def _scoped(cfg: Config, name: str) -> str:
    """``name`` as the config's default scope finds it."""
    scope = cfg.get('default_scope', None)
    return name if scope in PLAIN_NAME_SCOPES else f'mmdet.{name}'


def complete_runtime(cfg: Config) -> List[str]:
    """Put mmpe's runtime pieces into ``cfg`` where they are missing.

    Args:
        cfg (Config): A full config; changed in place.

    Returns:
        list[str]: One phrase per change (empty if none), for one log line.
    """
    changes = []
    hooks = list(cfg.get('custom_hooks', None) or [])
    added = [
        name for name, aliases in RUNTIME_HOOKS
        if not any(type_name(h) in (name, *aliases) for h in hooks)
    ]
    if added:
        hooks += [dict(type=_scoped(cfg, name)) for name in added]
        changes.append(f'added {", ".join(added)} to custom_hooks')
    cfg.custom_hooks = hooks

    replaced = []
    if cfg.get('default_hooks', None) is None:
        cfg.default_hooks = {}
    ckpt = cfg.default_hooks.get('checkpoint', 'absent')
    stock, ours = SUBCLASSES[0]
    if ckpt == 'absent':  # MMEngine would register CheckpointHook(interval=1)
        cfg.default_hooks['checkpoint'] = dict(
            type=_scoped(cfg, ours), interval=1)
        changes.append(f'default_hooks.checkpoint = {ours}(interval=1), '
                       f"MMEngine's default {stock} otherwise")
    elif isinstance(ckpt, dict) and type_name(ckpt) == stock:
        ckpt['type'] = _scoped(cfg, ours)
        replaced.append(f'{ours} in place of {stock}')

    loop = cfg.get('train_cfg', None)
    stock, ours = SUBCLASSES[1]
    if isinstance(loop, dict):
        implicit = 'type' not in loop and loop.get('by_epoch', False)
        if implicit or ('type' in loop and type_name(loop) == stock):
            loop.pop('by_epoch', None)  # only MMEngine's implicit form has it
            loop['type'] = _scoped(cfg, ours)
            replaced.append(f'{ours} in place of {stock}')
    if replaced:
        changes.append(' and '.join(replaced) + ' (same arguments)')
    return changes

