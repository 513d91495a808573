"""Convert a DINOv2 backbone (facebookresearch/dinov2 hub weights, ViT-S/B/L
with or without registers) to mmpe's CPVT weights.

Example (ViT-B/14 with registers)::

    wget https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_reg4_pretrain.pth
    python tools/model_converters/dinov2_to_mmpe.py \\
        dinov2_vitb14_reg4_pretrain.pth checkpoints/dinov2_vitb14_reg_mmpe.pth

The output holds the backbone's keys (load it with ``init_cfg=dict(
type='Pretrained', checkpoint=...)`` in the backbone); the printed config
computes the authors' features (``pos_embed_interp`` as their hub model
resamples the table). ``--drop-prefix-tokens`` drops the class and register
tokens for ViTDet's window blocks. A file of another model, or one with
keys missing, is refused with one line naming the keys (exit status 2;
nothing is written).
"""
from foundation_cli import base_parser, convert_file

from mmpe.models.utils.dinov2_weights import dinov2_to_mmpe


def main() -> None:
    parser = base_parser('Convert DINOv2 ViT-S/B/L (/14, with or without '
                         'registers) weights to mmpe CPVT weights')
    parser.add_argument(
        '--num-heads', type=int, default=None,
        help='attention heads (default: the hub model of that width)')
    args = parser.parse_args()
    convert_file(args, lambda sd: dinov2_to_mmpe(
        sd, args.drop_prefix_tokens, args.num_heads))


if __name__ == '__main__':
    main()
