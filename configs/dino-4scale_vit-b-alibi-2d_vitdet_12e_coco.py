# DINO (4 scales, mmdet 3.3's head, encoder and decoder) on a plain ViT-B/16
# in ViTDet's layout whose position information is 2D ALiBi (CROMA, Fuller et
# al., NeurIPS 2023): in every block each of the 12 heads subtracts its
# ALiBi slope times the Euclidean distance between tokens from the logits
# (on the 14 x 14 window grid in window blocks, the full grid in the global
# blocks 2, 5, 8, 11); no parameters, no absolute table;
# trained with detrex's DINO-ViTDet recipe
# (_base_/models/dino-4scale_vit-b_vitdet.py: AdamW 1e-4, weight decay 1e-4
# with norms at 0, backbone and pyramid at lr x 0.1, clipping at 0.1, the
# simple pyramid and a 1x1 conv + GroupNorm per level, no final norm; 12
# epochs, lr x 0.1 at epoch 11, batch 16, no warm-up).
#
# Reference number: detrex's dino_vitdet_base_4scale_12ep.py
# (DINO-ViTDet-Base-4scale, MAE ViT-B, box AP 50.2), whose backbone is
# configs/dino-4scale_vit-b-rel-pos_vitdet_12e_coco.py. This config is that
# run with ViTDet's absolute table and relative tables replaced by 2D ALiBi,
# everything else equal (the bias decays like every weight, detrex's rule
# exempting only norms): the difference to 50.2 (or, better, to the rel-pos
# config run alike) is the encoding's. Every other place mmpe differs from
# detrex, with the reasons: the base file's header. No 50-epoch twin.
#
# Pre-trained weights: MAE's ViT-B, the same file as the PEG, iRPE and
# RoPE-Mixed configs; this encoding drops MAE's absolute table (and the
# class token; MAE's final norm is not used):
#   wget https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth
#   python tools/model_converters/timm_vit_to_cpvt.py \
#       mae_pretrain_vit_base.pth checkpoints/vit-b_mae-in1k_cpvt.pth
# To train from scratch instead: --cfg-options model.backbone.init_cfg=None
_base_ = './_base_/models/dino-4scale_vit-b_vitdet.py'

model = dict(
    backbone=dict(
        pos_encoding='alibi-2d',
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-b_mae-in1k_cpvt.pth')))
