# configs/dino-4scale_vit-b-irpe_vitdet_12e_coco.py on detrex's 50-epoch
# DINO-ViTDet schedule (projects/dino/configs/dino-vitdet/
# dino_vitdet_base_4scale_50ep.py: 50 epochs, lr x 0.1 at epoch 40, no
# warm-up; DINO-ViTDet-Base-4scale, MAE ViT-B: box AP 55.0 with ViTDet's
# own encoding, this config's reference point: it swaps the encoding).
# Model, optimiser, data, pre-trained weights (converted by
# tools/model_converters/timm_vit_to_cpvt.py) and every difference from
# detrex: as the 12-epoch config's header says.
_base_ = './dino-4scale_vit-b-irpe_vitdet_12e_coco.py'

max_epochs = 50
train_cfg = dict(max_epochs=max_epochs)
lr_steps = dict(
    type='MultiStepLR',
    begin=0,
    end=max_epochs,
    by_epoch=True,
    milestones=[40],
    gamma=0.1)
param_scheduler = [lr_steps]
