"""Write checkpoints that stock ``torch.load(weights_only=True)`` opens.

MMEngine 0.10's ``Runner.save_checkpoint`` stores the message hub's state
(``HistoryBuffer`` objects holding numpy arrays, pickled with references to
their statistics methods through ``builtins.getattr``) and whatever hooks add;
torch's weights-only loader refuses those globals. This hook runs last in
``before_save_checkpoint`` and replaces every such value by its tagged plain
form (:func:`mmpe.engine.plain_state.to_plain`); in
``after_load_checkpoint``, which ``Runner.resume`` calls before it loads the
message hub, it turns them back (:func:`~mmpe.engine.plain_state.from_plain`),
so a resumed run's logged averages and every hook's state are what the
uninterrupted run had. Values of other types are left as they are and named
in one warning.

``configs/_base_/runtime_mmpe.py`` declares it (and
:class:`~mmpe.engine.MMPERunner` adds it where a config's own
``custom_hooks`` left it out); elsewhere::

    custom_hooks = [dict(type='PlainCheckpointHook')]
"""
import logging

from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmdet.registry import HOOKS
from .plain_state import from_plain, non_plain_paths, to_plain


@HOOKS.register_module()
class PlainCheckpointHook(Hook):
    """Store checkpoints as tensors, numbers, strings, lists, tuples, dicts.

    Priority ``'LOWEST'``: on save it sees what every other hook added (e.g.
    :class:`~mmpe.engine.RNGStateHook`'s states); on load the other hooks see
    the tagged forms of numpy values they stored themselves, the Runner sees
    the restored objects.
    """

    priority = 'LOWEST'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key, value in list(checkpoint.items()):
            checkpoint[key] = to_plain(value)
        left = non_plain_paths(checkpoint)
        if left:
            print_log(
                'PlainCheckpointHook: these checkpoint values are not plain '
                'data, so torch.load(weights_only=True) will refuse the '
                f'file: {", ".join(left)}',
                logger='current',
                level=logging.WARNING)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        for key, value in list(checkpoint.items()):
            checkpoint[key] = from_plain(value)
