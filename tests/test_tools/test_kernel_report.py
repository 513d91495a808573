"""The compile report of the fused Triton kernels
(``tools/analysis/kernel_report.py``) and the properties of the kernels'
compiled code that it guards: deterministic for a given Triton and ptxas,
so they are tests, not benchmarks.

* The SASS reading (``kernel_sass.py``) against SASS written here, its
  loops and instructions counted by hand.
* The checks see kernels that break them (``kernel_controls.py``, run in a
  process of its own): an atomic add with Triton's default ordering in a
  loop (a GPU-scope fence around each), relaxed (none), and mmpe's first
  Triton kernels (tests/data/kernel_v1: spills, ptxas C7515, 2,674
  instructions per tile in backward-q).
* The kernels of today for the main settings (ViT-S and DETR heads;
  contextual product on k, on q and k; ViTDet's decomposed relative
  position), bfloat16, sm_90: no spills, no C7515, no fence in a loop, no
  atomic outside the kernel that accumulates a term's bucket sums, the
  kernels without a term within 1,300 instructions per tile at head dim 64,
  and each setting within its budget of instructions per tile.

Skipped, naming why, where the installed Triton cannot compile for CUDA.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

import kernel_sass  # tools/analysis, on the path through pytest.ini

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))

#: the no-term kernels at head dim 64: the issue's budget (forward + both
#: backward loops, instructions per 64 x 64 tile per warp)
NO_TERM_BUDGET = 1300
#: with a term: at most this times the same kernels without one. The aim
#: is 2.0 (docs/benchmark.md says where it is not met); these budgets are
#: today's ratios plus about 5 %, so that a change that makes the kernels
#: heavier fails here
RATIO_BUDGET = {
    ('vit-s', 'ctx product k'): 2.35,
    ('detr', 'ctx product k'): 2.6,
    ('vit-s', 'ctx product qk'): 4.55,
    ('detr', 'ctx product qk'): 4.65,
    ('vit-s', 'rel-pos'): 2.5,
    ('detr', 'rel-pos'): 2.9,
}


def _env() -> dict:
    env = dict(os.environ)
    env.pop('TRITON_INTERPRET', None)  # compile, do not interpret
    # the controls import the report's modules, as the report's own
    # folder gives them to it
    env['PYTHONPATH'] = os.pathsep.join(
        [osp.join(ROOT, 'tools', 'analysis')] +
        ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    return env


def _run(args, tmp_path_factory, name) -> object:
    out = str(tmp_path_factory.mktemp(name) / 'out.json')
    proc = subprocess.run([sys.executable, *args, out], env=_env(),
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode == 2:
        pytest.skip(f'no CUDA compiler here: {proc.stderr.strip()[-300:]}')
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


def _pinned_triton() -> str:
    """The Triton release of requirements/triton.txt (the budgets and the
    spill checks are measured with it)."""
    with open(osp.join(ROOT, 'requirements', 'triton.txt')) as f:
        pins = [line.split('==')[1].strip() for line in f
                if line.startswith('triton==')]
    return pins[0]


@pytest.fixture(scope='module')
def report(tmp_path_factory):
    reports = _run([osp.join('tools', 'analysis', 'kernel_report.py'),
                    '--subset', 'main', '--json'], tmp_path_factory,
                   'report')
    (only, ) = reports
    installed = only['versions']['triton']
    if installed != _pinned_triton():
        # another release compiles other code (Triton 3.6: mma.sync where
        # 3.9 issues wgmma on half tiles, more registers): the budgets are
        # the pinned release's; `make kernel-report` reports any release
        pytest.skip(f'the budgets are measured with Triton '
                    f'{_pinned_triton()}; installed {installed}')
    return only


@pytest.fixture(scope='module')
def controls(tmp_path_factory):
    return _run([osp.join('tests', 'test_tools', 'kernel_controls.py')],
                tmp_path_factory, 'controls')


# ------------------------------------------------------ reading the SASS
SASS = '''
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0020*/                   LDG.E.U16 R2, desc[UR4][R4.64] ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0040*/                   MEMBAR.ALL.GPU ;
        /*0050*/                   REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR4][R6.64], R3 ;
        /*0060*/                   CCTL.IVALL ;
        /*0070*/                   MEMBAR.ALL.CTA ;
        /*0080*/                   STL [R1], R2 ;
        /*0090*/              @!P0 BRA `(.L_x_0) ;
        /*00a0*/                   LDGSTS.E.BYPASS.128 [R8], desc[UR4][R10.64] ;
.L_x_1:
        /*00b0*/                   FADD R2, R2, R3 ;
        /*00c0*/                   LDL R2, [R1] ;
        /*00d0*/               @P1 BRA `(.L_x_1) ;
        /*00e0*/                   EXIT ;
.L_x_2:
        /*00f0*/                   BRA `(.L_x_2);
'''


def test_sass_loops_and_their_counts():
    """Two loops (0x20-0x90: 8 instructions, 0xb0-0xd0: 3); the branch to
    itself after EXIT is no loop; each counter by hand."""
    loops = kernel_sass.loops(SASS)
    assert [(lp.start, lp.end) for lp in loops] == [(0x20, 0x90),
                                                    (0xb0, 0xd0)]
    first, second = (lp.counts for lp in loops)
    assert first == dict(instructions=8, tensor_core=1, global_loads=1,
                         async_copies=0, global_atomics=1, fences=2,
                         cta_fences=1, spills=1)
    assert second == dict(instructions=3, tensor_core=0, global_loads=0,
                          async_copies=0, global_atomics=0, fences=0,
                          cta_fences=0, spills=1)
    assert kernel_sass.per_tile(loops)['instructions'] == 11
    assert not any(lp.nested for lp in loops)


def test_nested_loops_count_the_inner_one():
    sass = '''
.L_x_0:
        /*0000*/                   IADD3 R0, R0, 0x1, RZ ;
.L_x_1:
        /*0010*/                   FADD R2, R2, R3 ;
        /*0020*/               @P1 BRA `(.L_x_1) ;
        /*0030*/               @P0 BRA `(.L_x_0) ;
'''
    loops = kernel_sass.loops(sass)
    assert [(lp.start, lp.end, lp.nested) for lp in loops] == [
        (0x0, 0x30, True), (0x10, 0x20, False)]
    assert kernel_sass.per_tile(loops)['instructions'] == 2


def test_ptxas_log():
    log = ('ptxas info    : (C7515) Potential Performance Loss: '
           'wgmma.mma_async instructions are serialized due to ...\n'
           'ptxas info    : Function properties for k\n'
           '    224 bytes stack frame, 224 bytes spill stores, 232 bytes '
           'spill loads\n'
           'ptxas info    : Used 255 registers, used 1 barriers\n')
    got = kernel_sass.parse_ptxas_log(log)
    assert (got['registers'], got['spill_stores'], got['spill_loads'],
            got['c7515']) == (255, 224, 232, 1)


# ------------------------------------- the checks see kernels that break them
def test_an_acq_rel_atomic_in_a_loop_is_fenced(controls):
    fenced, relaxed = controls['acq_rel'], controls['relaxed']
    assert fenced['per_tile']['global_atomics'] > 0
    assert fenced['per_tile']['fences'] > 0
    assert relaxed['per_tile']['global_atomics'] > 0
    assert relaxed['per_tile']['fences'] == 0


def test_the_first_kernels_break_every_check(controls):
    """mmpe's first backward-q kernel (ViT-S heads, contextual product on
    k, bfloat16): the numbers its issue measured by hand."""
    v1 = controls['v1 backward_q']
    assert v1['registers'] == 255
    assert v1['spill_stores'] > 0 and v1['sass_spills'] > 0
    assert v1['c7515'] > 0
    assert v1['per_tile']['fences'] > 0
    assert v1['per_tile']['global_atomics'] == 64
    assert v1['per_tile']['instructions'] > NO_TERM_BUDGET


# ------------------------------------------------------ today's kernels
def _rows(report):
    return {(r['heads'], r['setting']): r for r in report['rows']}


def test_main_settings_compile_lean(report):
    """No spills, no C7515 and no fence in a loop in any kernel; global
    atomics only in the kernel that accumulates a term's bucket sums
    (backward-q: the term on keys; backward-kv: on queries), at most one
    per pair (32 pairs per thread): a product's bucket, or a cross term's
    column part with its row part summed per query row (rel-pos: one
    atomic per row and grid row of the tile on top)."""
    rows = _rows(report)
    assert set(rows) == {(h, s) for h in ('vit-s', 'detr') for s in (
        'no term', 'ctx product k', 'ctx product qk', 'rel-pos')}
    for (heads, setting), row in rows.items():
        scatters = {'forward': 0,
                    'backward_kv': 1 if 'qk' in setting else 0,
                    'backward_q': 1 if setting != 'no term' else 0}
        if setting == 'rel-pos':  # the row part's sums: a few per row
            scatters['backward_q'] = 1.5
        for name, k in row['kernels'].items():
            where = (heads, setting, name)
            assert k['spill_stores'] == 0 and k['sass_spills'] == 0, where
            assert k['c7515'] == 0, (where, k['warnings'])
            assert k['per_tile']['fences'] == 0, where
            assert k['per_tile']['spills'] == 0, where
            assert k['per_tile']['global_atomics'] <= 32 * scatters[name], \
                (where, k['per_tile'])


def test_instructions_per_tile_within_budget(report):
    rows = _rows(report)
    assert rows[('vit-s', 'no term')]['per_tile'] <= NO_TERM_BUDGET
    for (heads, setting), budget in RATIO_BUDGET.items():
        ratio = (rows[(heads, setting)]['per_tile'] /
                 rows[(heads, 'no term')]['per_tile'])
        assert ratio <= budget, (heads, setting, ratio)


def test_the_report_names_its_versions(report):
    assert report['arch'] == 90
    assert report['versions']['triton'] and report['versions']['ptxas']
    assert report['aims'], 'the aims of the main settings'
