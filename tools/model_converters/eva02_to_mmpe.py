"""Convert an EVA-02 backbone (the MIM-pretrained B / L the authors publish
through timm, ``eva02_{base,large}_patch14_224.mim_in22k``) to mmpe's CPVT
weights.

Example (EVA-02-B, the RoPE positions interpolated to a 64 x 64 detection
grid and 16 x 16 windows, the class token dropped for the window blocks)::

    python tools/model_converters/eva02_to_mmpe.py \\
        eva02_base_patch14_224.mim_in22k.pth checkpoints/eva02_b_mmpe.pth \\
        --ft-grid 64 64 --window-size 16 --drop-prefix-tokens

The input is timm's state dict of the model (``model.state_dict()``, or the
hub's ``.pth`` / ``.safetensors`` saved with ``torch.save``). The printed
config computes timm's features at ``--ft-grid`` (``rope_cfg.scale``); set
``window_size`` and ``global_blocks`` beside it. A file of another model,
or one with keys missing, is refused with one line naming the keys (exit
status 2; nothing is written).
"""
from foundation_cli import base_parser, convert_file

from mmpe.models.utils.eva02_weights import eva02_to_mmpe


def main() -> None:
    parser = base_parser('Convert EVA-02 B / L (timm, MIM) weights to mmpe '
                         'CPVT weights')
    parser.add_argument(
        '--ft-grid', type=int, nargs=2, default=None, metavar=('H', 'W'),
        help='token grid the RoPE positions are interpolated to (default: '
        'the pretraining grid)')
    parser.add_argument(
        '--window-size', type=int, default=0,
        help='window side S: the window blocks interpolate to (S, S)')
    parser.add_argument(
        '--num-heads', type=int, default=None,
        help='attention heads (default: EVA-02 B / L of that width)')
    args = parser.parse_args()
    convert_file(args, lambda sd: eva02_to_mmpe(
        sd, args.ft_grid, args.window_size, args.drop_prefix_tokens,
        args.num_heads))


if __name__ == '__main__':
    main()
