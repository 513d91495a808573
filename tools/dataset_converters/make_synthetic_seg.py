r"""Generate mmpe's embedded data set with semantic label maps (mmseg).

    python tools/dataset_converters/make_synthetic_seg.py
    python tools/dataset_converters/make_synthetic_seg.py \
        --num-train 200 --out-dir /tmp/synthetic_coco

Makes (or finds) the COCO-format set of ``make_synthetic_coco.py`` with the
same arguments -- its files unchanged -- and writes ``seg_maps/{train,val}/``
label maps beside it (0 background, 1..4 the shapes; see
``mmpe/datasets/synthetic_seg.py``). Re-running with the same arguments is a
no-op; existing data made otherwise is never replaced unless
``--overwrite`` is given.
"""
import importlib.util
import os.path as osp
import sys

HERE = osp.dirname(osp.abspath(__file__))


def _coco_tool():
    spec = importlib.util.spec_from_file_location(
        '_make_synthetic_coco', osp.join(HERE, 'make_synthetic_coco.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    tool = _coco_tool()
    args = tool.parse_args(argv)
    summary = tool.generate(tool.load_generator().generate_synthetic_seg,
                            args)
    if summary is None:
        return 2
    if summary.skipped:
        print(f'{args.out_dir}: images and label maps already generated '
              'with these parameters, nothing written')
    else:
        print(f'wrote {args.out_dir}:')
    for split in summary.ann_files:
        print(f'  {split}: {summary.num_images.get(split, 0)} images in '
              f'{summary.img_dirs[split]}/, label maps in '
              f'{osp.join(args.out_dir, "seg_maps", split)}/')
    print(f'took {summary.seconds:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
