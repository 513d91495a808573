# The embedded synthetic shapes as semantic segmentation (mmseg scope): the
# images of data/synthetic_coco and the label maps written beside them by
#   python tools/dataset_converters/make_synthetic_seg.py
# 5 classes, background (0) included (reduce_zero_label=False). Training
# takes random crop_size crops at the images' own scale (long side 128-256,
# aspect 1:3-3:1, so crops of thin images are padded by the data
# preprocessor); testing is whole-image at the generated size (the
# Resize's scale_factor is the knob of the resolution study), evaluated
# with mmseg's IoUMetric (mIoU).
dataset_type = 'SyntheticSegDataset'
data_root = 'data/synthetic_coco/'
crop_size = (128, 128)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale_factor=1.0, keep_ratio=True),
    # after Resize: scored against the label map at the original size
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='train', seg_map_path='seg_maps/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='val', seg_map_path='seg_maps/val'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
