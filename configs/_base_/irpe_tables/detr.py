# iRPE table recipe of the authors' DETR code (the released DETR-iRPE
# models): the DETR-iRPE configs take `rpe_table_init` and
# `rpe_table_decay_mult` from the recipe file named in their `_base_`.
#
# - Xavier init: their `Transformer._reset_parameters` runs
#   `nn.init.xavier_uniform_(p)` on every transformer parameter with
#   `p.dim() > 1`, RPE tables included (microsoft/Cream,
#   iRPE/DETR-with-iRPE/models/transformer.py); the paper's DETR section says
#   "All transformer blocks are initialized with Xavier". mmpe's
#   `PEDETR.init_weights` re-draws each table with `init='xavier'` using
#   the fans of the authors' table layout (`iRPE.reset_table`).
# - Weight decay 1e-4 on every parameter: their `main.py` builds two AdamW
#   groups (backbone / rest, differing only in lr) with
#   `weight_decay=args.weight_decay` (default 1e-4) and no exclusions
#   (iRPE/DETR-with-iRPE/main.py). decay_mult 1.0 = like every other weight.
#
# The other recipe, the paper's ImageNet (DeiT) one, is irpe_tables/imagenet.py.
rpe_table_init = 'xavier'
rpe_table_decay_mult = 1.0
