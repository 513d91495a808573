"""Checks of a config, so that a user mistake ends in one clear message
instead of a stack of tracebacks from inside a dataloader worker or a
forward: the data paths, work dir and worker settings (run by
``tools/train.py`` and ``tools/test.py`` before a Runner is built) and the
feature levels of a multi-scale deformable DETR (run by the detector when it
is built, :class:`mmpe.models.PaddingAwareDINO`)."""
import glob
import os.path as osp
from typing import Iterator, List, Optional

from mmengine.config import Config

SYNTHETIC_HINT = ('generate it with: python '
                  'tools/dataset_converters/make_synthetic_coco.py '
                  '--out-dir {root}')
COCO_HINT = ('download COCO 2017 to data/coco/ (annotations/, train2017/, '
             'val2017/) or point `data_root` at it with --cfg-options')


class DataNotFoundError(FileNotFoundError):
    """A config names a data set file that does not exist."""


def _iter_datasets(dataset_cfg) -> Iterator[dict]:
    """Yield leaf dataset configs, looking through dataset wrappers."""
    if dataset_cfg is None:
        return
    if 'datasets' in dataset_cfg:  # ConcatDataset
        for sub in dataset_cfg['datasets']:
            yield from _iter_datasets(sub)
    elif 'dataset' in dataset_cfg:  # RepeatDataset, ClassBalancedDataset...
        yield from _iter_datasets(dataset_cfg['dataset'])
    else:
        yield dataset_cfg


def missing_data_files(cfg: Config,
                       splits=('train', 'val', 'test')) -> List[str]:
    """Annotation files named by the config's dataloaders that are missing.

    Args:
        cfg (Config): A full mmdet config.
        splits (tuple[str]): Which ``<split>_dataloader`` to look at.

    Returns:
        list[str]: Missing paths, ``data_root`` joined with ``ann_file``.
    """
    missing = []
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for ds in _iter_datasets(loader.get('dataset')):
            ann_file = ds.get('ann_file')
            if not ann_file:
                continue
            path = osp.join(ds.get('data_root') or '', ann_file)
            if not osp.isfile(path) and path not in missing:
                missing.append(path)
    return missing


def check_data_paths(cfg: Config, splits=('train', 'val', 'test')) -> None:
    """Raise :class:`DataNotFoundError` naming every missing annotation file
    and how to make or get it."""
    missing = missing_data_files(cfg, splits)
    if not missing:
        return
    lines = [f'Data set file(s) named in the config are missing:']
    for path in missing:
        root = path.split('annotations')[0].rstrip('/') or '.'
        hint = SYNTHETIC_HINT.format(root=root) if 'synthetic' in path \
            else COCO_HINT
        lines.append(f'  {path}\n    -> {hint}')
    raise DataNotFoundError('\n'.join(lines))


def check_work_dir(work_dir: str, resume: Optional[object],
                   overwrite: bool) -> None:
    """Refuse to start a fresh run over a work dir that holds checkpoints.

    mmengine names checkpoints ``epoch_N.pth`` / ``iter_N.pth``, so a fresh
    run in the same directory would silently replace them.

    Raises:
        FileExistsError: If ``work_dir`` has ``*.pth`` files, ``resume`` is
            falsy and ``overwrite`` is False.
    """
    ckpts = sorted(glob.glob(osp.join(work_dir, '*.pth')))
    if ckpts and not resume and not overwrite:
        shown = ', '.join(osp.basename(c) for c in ckpts[:3])
        more = f' and {len(ckpts) - 3} more' if len(ckpts) > 3 else ''
        raise FileExistsError(
            f'work_dir {work_dir!r} already holds checkpoints ({shown}{more})'
            ' that a fresh run would overwrite. Pass --resume to continue it, '
            'choose another --work-dir, or pass --overwrite to replace them.')


def fix_worker_settings(cfg: Config) -> None:
    """``persistent_workers=True`` with ``num_workers=0`` makes torch's
    DataLoader raise; turn it off where a config (or ``--cfg-options``) asks
    for no workers, so that ``num_workers=0`` alone is enough."""
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if loader and loader.get('num_workers', 0) == 0 \
                and loader.get('persistent_workers', False):
            loader['persistent_workers'] = False


def neck_num_outs(neck: Optional[dict]) -> Optional[int]:
    """Number of maps a neck config gives: ``num_outs`` where set, else
    ``len(scale_factors)`` (ViTSimpleFPN, whose default has 4) or
    ``len(in_channels)`` (ChannelMapper, FPN); None without a neck or when
    it cannot be told."""
    if not neck:
        return None
    if neck.get('num_outs') is not None:
        return neck['num_outs']
    if neck.get('type') == 'ViTSimpleFPN':
        return len(neck.get('scale_factors', (4.0, 2.0, 1.0, 0.5)))
    value = neck.get('in_channels')
    return len(value) if isinstance(value, (list, tuple)) else None


def check_feature_levels(detector: str, neck: Optional[dict],
                         num_feature_levels: int, encoder: Optional[dict],
                         decoder: Optional[dict]) -> None:
    """Refuse a multi-scale deformable DETR (DINO, Deformable DETR) whose
    pyramid and attention disagree on the number of feature levels.

    The detector adds one level embedding per level (``num_feature_levels``)
    and each deformable attention samples ``num_levels`` maps, so the neck
    must give exactly that many; otherwise the first forward fails deep in
    the encoder.

    Args:
        detector (str): Name of the detector type, for the message.
        neck (dict, optional): The ``model.neck`` config.
        num_feature_levels (int): The detector's ``num_feature_levels``.
        encoder (dict, optional): ``model.encoder`` (its
            ``layer_cfg.self_attn_cfg.num_levels``, mmcv's default 4).
        decoder (dict, optional): ``model.decoder`` (its
            ``layer_cfg.cross_attn_cfg.num_levels``, default 4).

    Raises:
        ValueError: naming the fields and their values.
    """
    levels = {'num_feature_levels': num_feature_levels}
    for name, cfg, attn in (('encoder', encoder, 'self_attn_cfg'),
                            ('decoder', decoder, 'cross_attn_cfg')):
        attn_cfg = ((cfg or {}).get('layer_cfg') or {}).get(attn) or {}
        levels[f'{name}.layer_cfg.{attn}.num_levels'] = attn_cfg.get(
            'num_levels', 4)
    if len(set(levels.values())) > 1:
        shown = ', '.join(f'`{k}`={v}' for k, v in levels.items())
        raise ValueError(
            f'{detector}: the deformable attention and the detector disagree '
            f'on the number of feature levels ({shown}); give them one value')
    outs = neck_num_outs(neck)
    if outs is not None and outs != num_feature_levels:
        pyramid = ''
        if neck.get('type') == 'ViTSimpleFPN':
            pyramid = (
                f' (ViTSimpleFPN: `neck.scale_factors`='
                f'{tuple(neck.get("scale_factors", ()))}, each a level, then '
                f'pooled levels up to `neck.num_outs`; DINO-ViTDet\'s 4 '
                f'levels are scale_factors=(2.0, 1.0, 0.5), num_outs=4: '
                f'strides 8, 16, 32, 64)')
        raise ValueError(
            f'{detector}: the neck gives {outs} feature maps (`neck.num_outs`'
            f') but the encoder and decoder attend to {num_feature_levels} '
            f'levels (`num_feature_levels` and `num_levels` of the '
            f'deformable attention); make them equal{pyramid}')
