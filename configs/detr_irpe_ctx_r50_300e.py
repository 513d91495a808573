# The authors' second released DETR-iRPE setting: ratio 2.0 (9x9 buckets),
# 300 epochs, lr drop at epoch 200.
_base_ = './detr_irpe_ctx-r2.0_r50_150e.py'
max_epochs = 300
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[200],
        gamma=0.1)
]
