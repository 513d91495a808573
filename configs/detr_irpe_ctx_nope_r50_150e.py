# iRPE paper Tab. 6, #4: contextual iRPE only, *without* the sine absolute
# encoding (encoder and decoder).
_base_ = './detr_irpe_ctx_r50_150e.py'
model = dict(positional_encoding=None)
