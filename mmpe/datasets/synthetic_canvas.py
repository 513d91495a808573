"""The canvas twin of an embedded test set: the same validation images'
generator (parameters and seed read from the set's meta file) drawn on a
canvas ``factor`` times larger per side, objects of the same sizes in
pixels at the same expected number per unit area. A test on it changes the
sequence length without changing the object scale (a resized test changes
both); ``tools/analysis/eval_resolutions.py --canvas`` and the ablation's
RoPE-coordinate studies use it."""
import json
import os.path as osp

from .synthetic_coco import (GENERATOR_VERSION, META_FILE,
                             generate_synthetic_coco)
from .synthetic_image import SyntheticImageParams


def canvas_twin(data_root: str, factor: float) -> str:
    """Write (or find) the canvas set of the embedded set in ``data_root``.

    The canvas set has the validation split only, drawn with the set's seed
    and ``canvas=factor``, in ``<data_root>_canvas<factor>/`` (the generator
    refuses a folder that holds other data, and reuses its own).

    Args:
        data_root (str): Folder of a set made by
            :func:`~mmpe.datasets.generate_synthetic_coco`.
        factor (float): Canvas side over the original side, > 1.

    Returns:
        str: The canvas set's data root (with a trailing ``/``).

    Raises:
        ValueError: When the set was not made by mmpe's generator (or by
            another version of it), or is itself a canvas set, or
            ``factor`` is not > 1.
        FileExistsError: When the canvas folder holds other data.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not factor > 1:
        raise ValueError(f'the canvas factor must be a number > 1, got '
                         f'{factor!r}')
    meta_file = osp.join(data_root, 'annotations', META_FILE)
    if not osp.isfile(meta_file):
        raise ValueError(
            f'--canvas redraws the test set with mmpe\'s embedded data '
            f'generator, but {meta_file} (its record of the parameters) '
            'does not exist; make the data with '
            'tools/dataset_converters/make_synthetic_coco.py')
    with open(meta_file) as f:
        params = json.load(f)['params']
    if params.get('generator_version') != GENERATOR_VERSION:
        raise ValueError(
            f'{meta_file}: generator version '
            f"{params.get('generator_version')!r}, this code draws version "
            f'{GENERATOR_VERSION}; remake the data set first')
    if params.get('canvas', 1) != 1:
        raise ValueError(f'{meta_file}: the test set is already a canvas set '
                         f"(canvas={params['canvas']})")
    fields = SyntheticImageParams.__dataclass_fields__
    image = {k: tuple(v) if isinstance(v, list) else v
             for k, v in params.items() if k in fields}
    out = f"{data_root.rstrip('/')}_canvas{factor:g}"
    generate_synthetic_coco(
        out,
        num_train=0,
        num_val=params['num_val'],
        seed=params['seed'],
        img_format=params['img_format'],
        **dict(image, canvas=factor))
    return out + '/'
