# COCO 2017 as the RT-DETRv2 recipes load it (lyuwenyu/RT-DETR,
# rtdetrv2_pytorch/configs/dataset/coco_detection.yml and configs/rtdetrv2/
# include/dataloader.yml). The authors' transforms are torchvision's v2 on
# PIL images; step by step, what computes each here:
#   image decoding  PIL, RGB, no EXIF rotation: LoadImageFromFile with the
#                   pillow decoder and 'color_ignore_orientation' (the same
#                   pixels, in mmdet's BGR order; the data preprocessor
#                   swaps them back);
#   RandomPhotometricDistort(p=0.5)  mmpe's RandomPhotometricDistort, the
#                   same PIL operations and draws (mmdet's
#                   PhotoMetricDistortion adds brightness, scales contrast
#                   about 0 and keeps unclipped floats: not used);
#   RandomZoomOut(fill=0)  mmdet's Expand(mean 0, ratio 1-4, prob 0.5): the
#                   same canvas and placement, but for the floor of the
#                   offset range (int(w * r) - w here is w * r - w there:
#                   at most one pixel further right / down);
#   RandomIoUCrop(p=0.8)  mmpe's RandomIoUCrop(p=0.8), torchvision's rule
#                   (mmdet's MinIoURandomCrop asks every box, not the best
#                   centred one, to reach the IoU: not used);
#   SanitizeBoundingBoxes(min_size=1)  mmdet's FilterAnnotations(
#                   min_gt_bbox_wh=(1, 1), keep_empty=False): boxes under
#                   1 pixel dropped, the image kept without boxes; mmdet
#                   drops a box of exactly 1 pixel too (> where torchvision
#                   has >=);
#   RandomHorizontalFlip  mmdet's RandomFlip(prob=0.5): the same flip;
#   Resize([640, 640])  mmdet's Resize(scale=(640, 640), keep_ratio=False,
#                   backend='pillow'): PIL's bilinear resize of the 8-bit
#                   image, as torchvision calls it on PIL images;
#   ConvertPILImage / ConvertBoxes  the data preprocessor's mean 0, std 255
#                   (_base_/models/rtdetrv2_r50vd.py); mmdet keeps boxes in
#                   pixels, the head normalises them.
# The photometric, zoom-out and IoU-crop steps stop for the last epochs
# (the authors' `policy: stop_epoch`): `train_pipeline_stage2` without them,
# switched in by mmdet's PipelineSwitchHook at the recipe's epoch
# (configs/rtdetr/*.py). Batch-level multi-scale: the model's
# RTDETRBatchResize, stopped by BatchResizeStopHook at the same epoch.
# Data: every train2017 image, also those without boxes (torchvision's
# CocoDetection keeps them; mmdet's base drops them), crowd boxes out of the
# loss (the authors' ConvertCocoPolysToMask drops them), random batches
# (no aspect-ratio grouping: every image is 640 x 640), last partial batch
# dropped. Test: the same decoding, Resize to 640 x 640 as in training.
_base_ = 'mmdet::_base_/datasets/coco_detection.py'

backend_args = None
load_image = dict(
    type='LoadImageFromFile',
    imdecode_backend='pillow',
    color_type='color_ignore_orientation',
    backend_args=backend_args)
img_scale = (640, 640)
resize = dict(
    type='Resize',
    scale=img_scale,
    keep_ratio=False,
    backend='pillow',
    interpolation='bilinear')
sanitize = dict(
    type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False)
train_pipeline = [
    load_image,
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomPhotometricDistort', p=0.5),
    dict(type='Expand', mean=[0, 0, 0], to_rgb=False, ratio_range=(1, 4),
         prob=0.5),
    dict(type='RandomIoUCrop', p=0.8),
    sanitize,
    dict(type='RandomFlip', prob=0.5),
    resize,
    sanitize,
    dict(type='PackDetInputs')
]
# from the recipe's stop epoch on (the authors' policy ops removed)
train_pipeline_stage2 = [
    load_image,
    dict(type='LoadAnnotations', with_bbox=True),
    sanitize,
    dict(type='RandomFlip', prob=0.5),
    resize,
    sanitize,
    dict(type='PackDetInputs')
]
test_pipeline = [
    load_image,
    resize,
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
# 4 GPUs x 4 images: the authors' total_batch_size 16
train_dataloader = dict(
    batch_size=4,
    num_workers=4,
    persistent_workers=True,
    drop_last=True,
    batch_sampler=None,
    dataset=dict(
        filter_cfg=dict(filter_empty_gt=False, min_size=0),
        pipeline=train_pipeline,
        backend_args=backend_args))
# 4 GPUs x 8 images: the authors' 32 (every image is 640 x 640: no padding)
val_dataloader = dict(
    batch_size=8,
    num_workers=4,
    dataset=dict(pipeline=test_pipeline, backend_args=backend_args))
test_dataloader = val_dataloader
