"""The studies of the proxy ablation (``ablation.py``): for each study its
rows (name, quick-start config, ``--cfg-options``), its schedule, its
tests at other sizes and validations during training, the data variant it
trains on; and what makes two rows the same run."""
from typing import Dict, List, Optional, Sequence

DETR = 'configs/quickstart/detr_r18_synthetic.py'
DETR_IRPE = 'configs/quickstart/detr_irpe_r18_synthetic.py'
CPVT = 'configs/quickstart/mask-rcnn_cpvt-tiny_synthetic.py'
CPVT_PADMASK = 'configs/quickstart/mask-rcnn_cpvt-tiny_padmask_synthetic.py'
RPE = 'model.encoder.layer_cfg.self_attn_cfg.rpe_cfg'
DETR_ROPE2D = 'configs/quickstart/detr_rope2d_r18_synthetic.py'
DETR_ROPE_MIXED = 'configs/quickstart/detr_rope-mixed_r18_synthetic.py'
COND_IRPE = 'configs/quickstart/conditional-detr_irpe_r18_synthetic.py'
COND_ROPE_MIXED = \
    'configs/quickstart/conditional-detr_rope-mixed_r18_synthetic.py'
DETR_LOG_CPB = 'configs/quickstart/detr_log-cpb_r18_synthetic.py'
DETR_ALIBI = 'configs/quickstart/detr_alibi-2d_r18_synthetic.py'
DETR_LOOKHERE = 'configs/quickstart/detr_lookhere_r18_synthetic.py'
COND_LOG_CPB = 'configs/quickstart/conditional-detr_log-cpb_r18_synthetic.py'
DAB_IRPE = 'configs/quickstart/dab-detr_irpe_r18_synthetic.py'
DAB_BOX_RPB = 'configs/quickstart/dab-detr_box-rpb_r18_synthetic.py'
DAB_IRPE_BOX_RPB = 'configs/quickstart/dab-detr_irpe_box-rpb_r18_synthetic.py'
COND_POINT_RPB = \
    'configs/quickstart/conditional-detr_point-rpb_r18_synthetic.py'
COND_IRPE_POINT_RPB = \
    'configs/quickstart/conditional-detr_irpe_point-rpb_r18_synthetic.py'
NO_SINE = 'model.encoder_pe.absolute=none'
ROPE = 'model.encoder_pe.relative'
NORMALIZED = [f'{ROPE}.coords=normalized']
#: DINOv3's released setting (rescale 2) and a mild per-axis jitter
AUGMENTED = NORMALIZED + [f'{ROPE}.rescale=2.0', f'{ROPE}.jitter=1.2']
CLIP = ['index=clip', 'max_distance=3']  # the iRPE paper's Tab. 6 #5
VITDET = 'configs/quickstart/mask-rcnn_vit-tiny-peg_vitdet_synthetic.py'
CPVT_SEG = 'configs/quickstart/fpn_cpvt-tiny_synthetic-seg.py'
PCPVT_SEG = 'configs/quickstart/fpn_pcpvt-tiny_synthetic-seg.py'
SEG_STUDIES = ('cpvt_seg', 'cpvt_seg_shape')
#: studies on their own variant of the embedded set: study -> (default data
#: root, arguments of tools/dataset_converters/make_synthetic_seg.py)
STUDY_DATA = {
    'cpvt_seg_shape': ('data/synthetic_seg_shape', ['--object-hue', 'random'])
}
#: test of the segmentation studies -> extra --cfg-options of tools/test.py
#: (None: the run's final validation, which is that test at x1)
SEG_TESTS = {
    'x1': None,
    **{f'x{s:g}': [f'test_dataloader.dataset.pipeline.1.scale_factor={s}']
       for s in (1.5, 2.0)},
    'slide': ['model.test_cfg.mode=slide',
              'model.test_cfg.crop_size=(128,128)',
              'model.test_cfg.stride=(85,85)'],
}

SEG_ROWS = [
    (f'CPVT {pe}', CPVT_SEG, [f'model.backbone.pos_encoding={pe}'])
    for pe in ('peg', 'learnable', 'sine', 'none', 'rope-mixed', 'irpe')
] + [('Twins-PCPVT (mmseg)', PCPVT_SEG, [])]

#: study -> list of (row name, config, extra --cfg-options)
STUDIES: Dict[str, List[tuple]] = {
    'irpe_tab6': [
        ('#2 no PE', DETR_IRPE,
         ['model.positional_encoding=None', f'{RPE}=None']),
        ('#1 sine (DETR)', DETR, []),
        ('#3 sine + bias', DETR_IRPE, [f'{RPE}.mode=bias']),
        ('#4 ctx, no abs PE', DETR_IRPE, ['model.positional_encoding=None']),
        ('#5 sine + ctx clip', DETR_IRPE,
         [f'{RPE}.index=clip', f'{RPE}.max_distance=3']),
        ('#6 sine + ctx piecewise', DETR_IRPE, []),
    ],
    # 'product' is the config's own method: that row is the same run as
    # Tab. 6 #6 (identical config and options), so it is reused, not re-run
    'irpe_tab1': [
        (f'ctx {m}', DETR_IRPE,
         [f'{RPE}.method={m}'] if m != 'product' else [])
        for m in ('euclidean', 'quant', 'cross', 'product')
    ],
    'cpvt_res': [(f'CPVT {pe}', CPVT, [f'model.backbone.pos_encoding={pe}'])
                 for pe in ('peg', 'learnable', 'sine', 'rope2d', 'none')] + [
        # the same 'peg' model when the backbone is told the batch padding
        ('CPVT peg + padding mask', CPVT_PADMASK,
         ['model.backbone.pos_encoding=peg'])
    ],
    # the windowed twin as configured, and with global attention everywhere
    'vitdet_layout': [
        (f'{layout} {pe}', VITDET,
         [f'model.backbone.pos_encoding={pe}'] +
         (['model.backbone.window_size=0'] if layout == 'global' else []))
        for layout in ('global', 'windowed')
        for pe in ('none', 'peg', 'learnable', 'irpe', 'rope-mixed',
                   'rel-pos')
    ],
    'cpvt_seg': SEG_ROWS,
    'cpvt_seg_shape': SEG_ROWS,  # only the data differ (STUDY_DATA)
    # 'sine' and 'sine + iRPE ctx' are Tab. 6 #1 and #6 (the same commands)
    'encoder_pe_detr': [
        ('DETR sine', DETR, []),
        ('DETR sine + iRPE ctx', DETR_IRPE, []),
        ('DETR sine + RoPE-2D', DETR_ROPE2D, []),
        ('DETR sine + RoPE-Mixed', DETR_ROPE_MIXED, []),
        ('DETR RoPE-Mixed, no sine', DETR_ROPE_MIXED, [NO_SINE]),
        # the offset biases (issue 47)
        ('DETR sine + log-CPB', DETR_LOG_CPB, []),
        ('DETR sine + 2D ALiBi', DETR_ALIBI, []),
        ('DETR sine + LookHere', DETR_LOOKHERE, []),
    ],
    'encoder_pe_cond': [
        ('Cond. DETR sine', COND_ROPE_MIXED,
         ['model.encoder_pe.relative=None']),
        ('Cond. DETR sine + iRPE ctx', COND_IRPE, []),
        ('Cond. DETR sine + RoPE-2D', COND_ROPE_MIXED,
         ['model.encoder_pe.relative=rope2d']),
        ('Cond. DETR sine + RoPE-Mixed', COND_ROPE_MIXED, []),
        ('Cond. DETR RoPE-Mixed, no sine', COND_ROPE_MIXED, [NO_SINE]),
        ('Cond. DETR sine + log-CPB', COND_LOG_CPB, []),
        ('Cond. DETR sine + 2D ALiBi', COND_ROPE_MIXED,
         ['model.encoder_pe.relative=alibi-2d']),
        ('Cond. DETR sine + LookHere', COND_ROPE_MIXED,
         ['model.encoder_pe.relative=lookhere']),
    ],
}
# the rows of the RoPE-coordinate studies: (name, DETR config and options,
# Conditional DETR config and options); Conditional DETR's 'sine' row is
# its RoPE config without the relative part, and its iRPE is in encoder_pe
ROPE_COORD_ROWS = [
    ('sine', DETR, [], COND_ROPE_MIXED, [f'{ROPE}=None']),
    ('sine + RoPE-Mixed index', DETR_ROPE_MIXED, [], COND_ROPE_MIXED, []),
    ('sine + RoPE-Mixed normalized', DETR_ROPE_MIXED, NORMALIZED,
     COND_ROPE_MIXED, NORMALIZED),
    ('sine + RoPE-Mixed normalized, rescale 2, jitter 1.2', DETR_ROPE_MIXED,
     AUGMENTED, COND_ROPE_MIXED, AUGMENTED),
    ('sine + iRPE piecewise', DETR_IRPE, [], COND_IRPE, []),
    ('sine + iRPE clip', DETR_IRPE, [f'{RPE}.{o}' for o in CLIP], COND_IRPE,
     [f'{ROPE}.{o}' for o in CLIP]),
]
STUDIES['rope_coords_detr'] = [(f'DETR {name}', config, opts)
                               for name, config, opts, _, _ in ROPE_COORD_ROWS]
STUDIES['rope_coords_cond'] = [(f'Cond. DETR {name}', config, opts)
                               for name, _, _, config, opts in ROPE_COORD_ROWS]
# with and without the decoder's bias, with and without encoder iRPE; the
# 'sine' rows are the iRPE configs without the encoder's relative part
# (the bias configs' encoder-only twins, as the bias-only configs are theirs)
STUDIES['decoder_rpb_dab'] = [
    ('DAB-DETR sine', DAB_IRPE, [f'{ROPE}=None']),
    ('DAB-DETR sine + BoxRPB', DAB_BOX_RPB, []),
    ('DAB-DETR sine + iRPE ctx', DAB_IRPE, []),
    ('DAB-DETR sine + iRPE ctx + BoxRPB', DAB_IRPE_BOX_RPB, []),
]
STUDIES['decoder_rpb_cond'] = [
    ('Cond. DETR sine', COND_IRPE, [f'{ROPE}=None']),
    ('Cond. DETR sine + point-RPB', COND_POINT_RPB, []),
    ('Cond. DETR sine + iRPE ctx', COND_IRPE, []),
    ('Cond. DETR sine + iRPE ctx + point-RPB', COND_IRPE_POINT_RPB, []),
]
SCALES = (1.0, 1.5, 2.0)
#: studies tested at other sizes after training (tools/analysis/
#: eval_resolutions.py): study -> its tests, (kind, factor) with kind
#: 'resize' (the test pipeline's sizes times the factor) or 'canvas' (the
#: embedded test set drawn on a canvas that much larger, same objects)
RES_TESTS = {
    'cpvt_res': [('resize', s) for s in SCALES],
    'vitdet_layout': [('resize', 1.0), ('resize', 2.0)],
    **dict.fromkeys(('rope_coords_detr', 'rope_coords_cond'),
                    [('resize', s) for s in SCALES] + [('canvas', 2.0)]),
    **dict.fromkeys(('decoder_rpb_dab', 'decoder_rpb_cond'),
                    [('resize', 1.0), ('resize', 2.0)]),
}
#: studies validated every that many epochs (the others: at the end only);
#: every validation's AP and AP50 go to the run's ``val_curve``
VAL_EVERY = {'decoder_rpb_dab': 1, 'decoder_rpb_cond': 1}
#: epochs per run of each study, as reported in docs/results.md (what 2 CPU
#: cores allow for 3 seeds of every row in a few hours, not a full schedule)
DEFAULT_EPOCHS = {
    'irpe_tab6': 8,
    'irpe_tab1': 8,
    'cpvt_res': 4,
    'vitdet_layout': 4,  # the quick-start schedule
    'encoder_pe_detr': 8,
    'encoder_pe_cond': 4,  # ~ the wall time of DETR's 8 (step 0.72 / 0.41 s)
    'cpvt_seg': 150,  # iterations (of 8 crops): what 2 busy cores allowed
    'cpvt_seg_shape': 1500,  # iterations: the demo's schedule
    'rope_coords_detr': 8,  # the encoder_pe studies' schedules
    'rope_coords_cond': 4,
    # what 2 shared cores allowed in 100 minutes for 3 seeds of the rows
    # without encoder iRPE and 1 of those with (docs/results.md)
    'decoder_rpb_dab': 3,
    'decoder_rpb_cond': 3,
}


def run_key(study: str, config: str, options: Sequence[str], seed: int,
             epochs: Optional[int]) -> tuple:
    """What makes two runs the same run, whatever row they report (a
    study with its own data set never shares runs with another)."""
    data = STUDY_DATA[study][1] if study in STUDY_DATA else None
    # a run tested at other sizes is not the same as one that is not, nor
    # one validated during training (the validation loader draws from the
    # global generator) as one validated at the end only
    return (config, tuple(options), seed, epochs, str(data),
            str(RES_TESTS.get(study)), VAL_EVERY.get(study))


def trained_runs(results: List[dict]) -> Dict[tuple, dict]:
    """Finished runs (not copies) by their command."""
    return {
        run_key(r['study'], r['config'], r['options'], r['seed'],
                 r.get('epochs')): r
        for r in results if 'same_run_as' not in r
    }
