# configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py on DINO's longer
# schedule: 50 epochs, lr x 0.1 at epoch 40 (detrex's 50-epoch DINO-ViTDet
# schedule). ImageNet weights: as the 12-epoch config says (converted by
# tools/model_converters/timm_vit_to_cpvt.py).
_base_ = './dino-4scale_vit-b-irpe_vitdet_12e_coco.py'

max_epochs = 50
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[40],
        gamma=0.1)
]
