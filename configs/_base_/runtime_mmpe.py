# mmpe's runtime, shared by every mmpe config (detection and segmentation)
# and by a user's own config that adds this file to its `_base_`:
#   _base_ = ['mmdet::detr/detr_r50_8xb2-150e_coco.py',
#             '<path to mmpe>/configs/_base_/runtime_mmpe.py']
#   custom_imports = dict(imports=['mmpe'], allow_failed_imports=False)
# With it, mmdet's and mmseg's tools/train.py, `mim train` and mmpe's tools
# build the same runner (docs/user_guides/plugin.md: what holds with which
# launcher).
#
# MMEngine refuses a key that two `_base_` files both set, and mmdet's and
# mmseg's bases set `default_hooks` and `train_cfg`; so this file sets only
# keys they leave alone. MMPERunner (mmpe/engine/runner.py) completes the
# rest when it is built, with the same arguments:
#   default_hooks.checkpoint  CheckpointHook -> AtomicCheckpointHook
#                             (atomic writes, rotation after the write)
#   train_cfg                 EpochBasedTrainLoop ->
#                             ResumableEpochBasedTrainLoop (mid-epoch resume)
# and adds any hook below that a config's own `custom_hooks` list (which
# replaces this one) left out. It also loads checkpoints weights-only and,
# for --resume without a path, continues from the newest checkpoint that
# loads. The names resolve under default_scope 'mmdet' and 'mmseg' alike.
runner_type = 'MMPERunner'
custom_hooks = [
    # every image, annotation and label map checked before the first step
    # (and the test set before testing); problems: all listed, exit status 2.
    # skip_bad_images=True trains without the bad training images instead
    # (--cfg-options custom_hooks.0.skip_bad_images=True); see
    # docs/user_guides/dataset_check.md
    dict(type='DatasetCheckHook'),
    # optimizer parameter groups as plain dicts (compile=True traces step())
    dict(type='PlainParamGroupsHook'),
    # RNG states in checkpoints: a resumed run repeats the uninterrupted one
    dict(type='RNGStateHook'),
    # SIGTERM / SIGUSR1: iter_N.pth after the current iteration, exit 75
    dict(type='PreemptionHook'),
    # checkpoints open with stock torch.load(weights_only=True)
    dict(type='PlainCheckpointHook'),
]
