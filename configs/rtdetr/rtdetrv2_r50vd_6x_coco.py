# RT-DETRv2-L: RT-DETRv2 with ResNet-50-vd, 72 epochs on COCO 2017
# (lyuwenyu/RT-DETR, rtdetrv2_pytorch/configs/rtdetrv2/
# rtdetrv2_r50vd_6x_coco.yml, which only restates the included optimizer).
# Target: the released 53.4 box AP (AP50 71.6) on val2017 at 640 x 640
# (rtdetrv2_pytorch/README.md; checkpoint rtdetrv2_r50vd_6x_coco_ema.pth,
# converted by tools/model_converters/rtdetrv2_to_mmpe.py).
# Model: _base_/models/rtdetrv2_r50vd.py (the YAML's model, item by item);
# data, augmentations and their stop, EMA, optimiser, warm-up, AMP:
# _base_/schedules/rtdetrv2_coco.py and _base_/datasets/
# rtdetr_coco_detection.py, each with its differences from the authors'
# code and why. This recipe: backbone lr 1e-5 (x 0.1), 72 epochs, the
# augmentations and the multi-scale stopped from epoch 71 (0-based).
# Backbone weights (the authors' ImageNet file, PaddlePaddle's
# ResNet50_vd_ssld_v2):
#   wget https://github.com/lyuwenyu/storage/releases/download/v0.1/ResNet50_vd_ssld_v2_pretrained_from_paddle.pth
#   python tools/model_converters/rtdetrv2_to_mmpe.py --backbone \
#       ResNet50_vd_ssld_v2_pretrained_from_paddle.pth \
#       checkpoints/resnet50vd_ssld_v2_rtdetr_mmpe.pth
#   bash tools/dist_train.sh configs/rtdetr/rtdetrv2_r50vd_6x_coco.py 4
_base_ = [
    '../_base_/models/rtdetrv2_r50vd.py',
    '../_base_/schedules/rtdetrv2_coco.py',
]
