"""A small embedded COCO set (a module fixture) and a copy of it with one
of each problem the data set check names (``break_copy``), shared by the
data check's unit tests (tests/test_datasets) and its end-to-end tests
(tests/test_tools)."""
import json
import os
import os.path as osp
import shutil

import pytest

from mmpe.datasets import generate_synthetic_coco


@pytest.fixture(scope='module')
def coco_set(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('clean'))
    generate_synthetic_coco(root, num_train=10, num_val=2, seed=5,
                            min_size=64, max_size=96)
    return root



def break_copy(root, tmp_path):
    """A copy of the set with one of each bad thing; what was done to which
    file (file name, annotation id or None, kind)."""
    bad = str(tmp_path / 'bad')
    shutil.copytree(root, bad)
    ann_file = osp.join(bad, 'annotations', 'instances_train.json')
    with open(ann_file) as f:
        coco = json.load(f)
    imgs, anns = coco['images'], coco['annotations']
    first = {img['id']: next(a for a in anns if a['image_id'] == img['id'])
             for img in imgs}

    def path(i):
        return osp.join(bad, 'train', imgs[i]['file_name'])

    data = open(path(0), 'rb').read()
    open(path(0), 'wb').write(data[:len(data) // 2])
    open(path(1), 'w').write('not an image')
    os.remove(path(2))
    imgs[3]['height'] += 5
    first[imgs[4]['id']]['bbox'][1] = imgs[4]['height'] + 3.0
    first[imgs[5]['id']]['bbox'][3] = 0.0
    first[imgs[6]['id']]['category_id'] = 42
    poly = first[imgs[7]['id']]['segmentation']
    first[imgs[7]['id']]['segmentation'] = [poly[0][:4]] + poly[1:]
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    want = [(0, None, 'truncated JPEG'), (1, None, 'not an image'),
            (2, None, 'missing file'),
            (3, None, 'size differs from the annotation'),
            (4, first[imgs[4]['id']]['id'], 'box outside the image'),
            (5, first[imgs[5]['id']]['id'], 'zero-size box'),
            (6, first[imgs[6]['id']]['id'], 'unknown category'),
            (7, first[imgs[7]['id']]['id'],
             'polygon with fewer than 3 points')]
    return bad, [(path(i), ann, kind) for i, ann, kind in want]
