# iRPE table recipe of the paper's ImageNet (DeiT) experiments: tables start
# at zero, so a fresh model's attention is exactly that of the model without
# RPE (paper Sec. 4.1), and get no weight decay (decay would pull the learnt
# relative biases back to zero). Not what the authors' DETR code does (see
# irpe_tables/detr.py); to train DETR-iRPE this way, name this file instead
# of irpe_tables/detr.py in the `_base_` of configs/detr_irpe_ctx_r50_150e.py
# (and with it every Tab. 6 / released config) or of
# configs/quickstart/detr_irpe_r18_synthetic.py.
rpe_table_init = 'zeros'
rpe_table_decay_mult = 0.0
