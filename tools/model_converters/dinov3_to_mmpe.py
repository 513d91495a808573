"""Convert a DINOv3 backbone (facebookresearch/dinov3 hub weights, the
distilled ViT-S/B/L/16) to mmpe's CPVT weights.

Example (ViT-B/16, from the download links the authors send on request)::

    python tools/model_converters/dinov3_to_mmpe.py \\
        dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth \\
        checkpoints/dinov3_vitb16_mmpe.pth

The output holds the backbone's keys (load it with ``init_cfg=dict(
type='Pretrained', checkpoint=...)`` in the backbone); the printed config
computes the authors' features: RoPE on normalised patch centres
(``rope_cfg``), storage tokens as registers, LayerScale, LayerNorm eps
1e-5. ``--drop-prefix-tokens`` drops the class and storage tokens for
ViTDet's window blocks. A file of another model, or one with keys missing,
is refused with one line naming the keys (exit status 2; nothing is
written).
"""
from foundation_cli import base_parser, convert_file

from mmpe.models.utils.dinov3_weights import dinov3_to_mmpe


def main() -> None:
    parser = base_parser('Convert DINOv3 ViT-S/B/L/16 (distilled) weights '
                         'to mmpe CPVT weights')
    args = parser.parse_args()
    convert_file(args,
                 lambda sd: dinov3_to_mmpe(sd, args.drop_prefix_tokens))


if __name__ == '__main__':
    main()
