"""mmpe.datasets.synthetic_canvas: the canvas twin of an embedded set keeps
the generator's parameters and seed and changes only the canvas."""
import json
import os.path as osp

import pytest

from mmpe.datasets import generate_synthetic_coco
from mmpe.datasets.synthetic_canvas import canvas_twin


def _params(root):
    with open(osp.join(root, 'annotations', 'synthetic_coco_meta.json')) as f:
        return json.load(f)['params']


def test_twin_has_the_sets_parameters_and_a_larger_canvas(tmp_path):
    root = str(tmp_path / 'set')
    generate_synthetic_coco(root, num_train=2, num_val=2, seed=4,
                            min_size=64, max_size=80)
    out = canvas_twin(root + '/', 1.5)
    assert out == root + '_canvas1.5/'
    base, twin = _params(root), _params(out)
    assert twin.pop('canvas') == 1.5 and base.pop('canvas', 1) == 1
    assert (twin.pop('num_train'), base.pop('num_train')) == (0, 2)
    assert twin == base  # seed, sizes, generator version, ...
    assert canvas_twin(root, 1.5) == out  # found, not redrawn
    with pytest.raises(ValueError, match='already a canvas set'):
        canvas_twin(out, 2)


@pytest.mark.parametrize('factor', [1, 0.5, True, '2'])
def test_bad_factor_is_named(tmp_path, factor):
    with pytest.raises(ValueError, match=f'> 1, got {factor!r}'):
        canvas_twin(str(tmp_path), factor)


def test_a_set_without_the_generators_record(tmp_path):
    with pytest.raises(ValueError, match='make_synthetic_coco.py'):
        canvas_twin(str(tmp_path), 2.0)
