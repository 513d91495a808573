"""Every measured number of the docs comes from a data file in docs/data/.

* The tables between ``<!-- table: NAME -->`` and ``<!-- end table -->``
  are what ``tools/analysis/docs_tables.py`` makes of docs/data/*.json
  (``make docs-tables`` rewrites them): a committed table that differs from
  its data fails, and so does a number changed in a data file that the
  page does not follow.
* The prose of README.md and of every page of docs/ and docs/user_guides/
  but those of ``UNCHECKED`` quotes no measurement without a source. A
  measurement is a decimal number (``0.404``, ``1.16``) or an integer with
  a unit (``57 s``, ``245 MiB``, ``2x``); versions (``2.13.0``, ``PyTorch
  2.11``), grid sizes (``25 x 42``) and integers without a unit are not.
  Each must equal, at the decimals the page prints, a number of a data
  file the page names (``docs/data/NAME.json`` or ``data/NAME.json`` in a
  link), or of a generated table of the page or of a page it names, or be
  on ``ALLOWED`` with the reason it is not a measurement. Code blocks are
  left out: they show commands and what a tool prints.
"""
import glob
import json
import os.path as osp
import re
import shutil
import subprocess
import sys
from typing import Iterator, List, Set, Tuple

import pytest

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
SCRIPT = osp.join(ROOT, 'tools', 'analysis', 'docs_tables.py')
# pages whose numbers have no data file yet, so the rule would fail there
UNCHECKED = {}
PROSE_PAGES = ['README.md'] + sorted(
    page for page in (osp.relpath(p, ROOT) for p in
                      glob.glob(osp.join(ROOT, 'docs', '*.md')) +
                      glob.glob(osp.join(ROOT, 'docs', 'user_guides', '*.md')))
    if page not in UNCHECKED)
# page -> {number as printed, unit included: why it is not a measurement}
ALLOWED = {
    'README.md': {
        '2x': 'the test scale of the resolution sweep (a setting)',
    },
    'docs/benchmark.md': {
        '10%': "the benchmark's padding of the second image (a setting)",
        '1.9': "iRPE's piecewise ratio (a setting)",
        '1.2x': "the backbone benchmark's aim (a target)",
        '1.3x': "the aims' bound (a target)",
        '1.5x': "the aims' bound (a target)",
        '0.6x': "the Mask R-CNN step's aim (a target)",
        '2.0': "the compiled aims' bound on instructions per tile (a target)",
    },
    'docs/get_started.md': {
        '0.5': 'the AP50 threshold the text compares against',
    },
    'docs/user_guides/backbones.md': {
        '1.5x': 'a test scale (a setting)',
    },
    'docs/user_guides/vitdet.md': {
        '0.7': "ViTDet's layer-wise lr decay (a setting)",
        '0.75': "the plain bicubic kernel's constant a (the operator's equation)",
    },
    'docs/user_guides/checkpoints.md': {
        v: "the authors' published accuracy of the checkpoint (their table)"
        for v in ('40.9', '41.0', '42.2', '73.7', '80.9', '81.0', '81.2',
                  '82.3', '82.8')
    },
    'docs/user_guides/clusters.md': {
        '120 s': "the lead time of Slurm's signal (a setting)",
    },
    'docs/user_guides/detr_family.md': {
        '37.2': "Plain-DETR's published COCO AP (Lin et al., Tab. 2)",
        '46.1': "Plain-DETR's published COCO AP (Lin et al., Tab. 2)",
    },
    'docs/user_guides/embedded_dataset.md': {
        '30%': "the generator's object size range (a setting)",
        '70%': "the generator's object size range (a setting)",
        '1.0': "COCOeval of the ground truth against itself (a test's value)",
    },
    'docs/user_guides/rope_coordinates.md': {
        '6.3': '2 pi, the period in tokens of the fastest frequency pair',
        '30%': "the generator's object size range (a setting)",
        '70%': "the generator's object size range (a setting)",
        '1.2': "DINOv3's jitter setting",
        '1.5x': 'a test scale (a setting)',
    },
    'docs/user_guides/segmentation.md': {
        '0.90': "Twins-PCPVT's parameter count in millions (the model's size)",
        '1.5x': 'a test scale (a setting)',
    },
    'docs/results.md': {
        '70%': "the generator's object size range (a setting)",
        '40.9': "the iRPE authors' released COCO AP (their table)",
        '15.2': "the piecewise function's gamma at ratio 1.9 (its equation)",
        '37.2': "Plain-DETR's published COCO AP (Lin et al., Tab. 2)",
        '46.1': "Plain-DETR's published COCO AP (Lin et al., Tab. 2)",
        '0.052': 'a same-seed gap of two decoder_rpb.json values',
        **{v: 'a difference of two seg_scales.json values'
           for v in ('5.1', '6.3', '12.8', '14.1', '14.3', '17.6')},
    },
    'docs/summary.md': {
        '1.3': "the iRPE paper's published gain (Wu et al., Tab. 6)",
        '1x': 'a test scale (a setting)',
        '2x': 'a test scale (a setting)',
        '1.5x': 'a test scale (a setting)',
    },
    'docs/user_guides/attention_backends.md': {
        '2.11': 'a PyTorch version',
        '245 MiB': "3 B H L^2 s bytes of the estimate's equation, worked out",
        '979 MiB': 'four times that: the CUDA_MEMORY_FRACTION rule',
        '4.5 GiB': 'the same equation for ViT-B at 4096 tokens',
        '18 GiB': 'four times that',
    },
}
MARKED = re.compile(r'<!-- table: [\w.-]+ -->\n.*?<!-- end table -->',
                    re.DOTALL)
FENCE = re.compile(r'^\s*(```+|~~~+).*?^\s*\1\s*$', re.DOTALL | re.MULTILINE)
COMMENT = re.compile(r'<!--.*?-->', re.DOTALL)
LINK_TARGET = re.compile(r'\]\([^)]*\)')
INLINE_CODE = re.compile(r'`[^`\n]*`')
DATA_NAME = re.compile(r'(?:docs/)?data/([\w.-]+\.(?:json|md))')
UNITS = ('ms', 's', 'min', 'minutes', 'seconds', 'hours', 'MiB',
         'GiB', 'MB', 'GB', '%', 'x', 'files/s')
NUMBER = re.compile(r'(?<![\w./])(\d+(?:\.\d+)*)([A-Za-z%/]*)')
# a unit after the number, or after the end of a range that starts with it
UNIT_AFTER = re.compile(
    r'(?:\s?[-–]\s?\d+(?:\.\d+)?)*\s?({})(?![\w/])'.format('|'.join(
        re.escape(u) for u in sorted(UNITS, key=len, reverse=True))))
PACKAGE = re.compile(r'(?:PyTorch|torch|Python|Triton|mmcv|MMEngine|mmengine|'
                     r'MMDetection|mmdet|MMSegmentation|mmseg|timm|CUDA|'
                     r'opset|onnxruntime|ONNX)[ =]*$')


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args],
                          capture_output=True, text=True, timeout=300)


def test_committed_tables_are_what_the_data_gives():
    result = run_script('--check')
    assert result.returncode == 0, result.stderr


def test_a_changed_number_in_a_data_file_fails_the_check(tmp_path):
    """The check is not vacuous: the same docs with one number of
    attention_long_limit_bf16.json moved fail it, naming the table."""
    for sub in ('docs/data', ):
        shutil.copytree(osp.join(ROOT, sub), tmp_path / sub)
    for page in ('docs/benchmark.md', 'docs/results.md', 'docs/testing.md'):
        shutil.copy(osp.join(ROOT, page), tmp_path / page)
    path = tmp_path / 'docs' / 'data' / 'attention_long_limit_bf16.json'
    data = json.loads(path.read_text())
    row = data['groups'][0]['rows'][1]  # L = 1050, ViT-S, the iRPE row
    row['x'] += 0.1
    path.write_text(json.dumps(data))
    result = run_script('--check', '--root', str(tmp_path))
    assert result.returncode == 1
    assert 'docs/benchmark.md: table attention-long-limit' in result.stderr


def _numbers_in(value) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, str):
        for m in re.finditer(r'(?<![\w.])\d+(?:\.\d+)?', value):
            yield float(m.group(0))
    elif isinstance(value, dict):
        for k, v in value.items():
            if not k.endswith(('_all', 'rounds')):  # single rounds: not quoted
                yield from _numbers_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers_in(v)


def sources(page: str, text: str) -> Set[float]:
    """The numbers a page may quote: its data files' and those of the
    generated tables of the pages it names."""
    values: Set[float] = set()
    for name in set(DATA_NAME.findall(text)):
        path = osp.join(ROOT, 'docs', 'data', name)
        assert osp.isfile(path), f'{page} names docs/data/{name}: no file'
        with open(path) as f:
            values.update(_numbers_in(json.load(f) if name.endswith('.json')
                                      else f.read()))
    for other in glob.glob(osp.join(ROOT, 'docs', '*.md')):
        if (osp.relpath(other, ROOT) != page
                and osp.basename(other) not in text):
            continue  # a page it does not name
        with open(other) as f:
            for block in MARKED.findall(f.read()):
                values.update(_numbers_in(block))
    return values


def measurements(text: str) -> List[Tuple[str, str]]:
    """(number as printed with its unit, the line) of every measurement in
    the prose of ``text``."""
    text = MARKED.sub('', text)
    text = FENCE.sub('', text)
    text = COMMENT.sub('', text)
    found = []
    for line in text.split('\n'):
        line = INLINE_CODE.sub('', LINK_TARGET.sub(']', line))
        for m in NUMBER.finditer(line):
            number, suffix = m.group(1), m.group(2)
            rest = line[m.end():]
            if (number.count('.') > 1 or PACKAGE.search(line[:m.start()])
                    or re.match(r'\.(x|\d)', rest)):
                continue  # a version: 2.13.0, PyTorch 2.11, 0.10.x
            if suffix == 'x' and re.match(r'\s?\d', rest):
                continue  # a grid or an image size, 25x42
            if suffix and suffix not in UNITS:
                continue  # 1e-4, AP50 and other names
            unit = suffix
            if not unit:
                after = UNIT_AFTER.match(rest)
                if after and not (after.group(1) == 'x'
                                  and re.match(r'\s?\d', rest[after.end():])):
                    unit = after.group(1)
            if '.' in number or unit:
                sep = '' if unit in ('x', '%', '') else ' '
                found.append((f'{number}{sep}{unit}', line.strip()))
    return found


def _sourced(printed: str, values: Set[float]) -> bool:
    number = re.match(r'\d+(?:\.\d+)?', printed).group(0)
    places = len(number.split('.')[1]) if '.' in number else 0
    want = float(number)
    return any(abs(round(v, places) - want) < 1e-9 for v in values)


@pytest.mark.parametrize('page', PROSE_PAGES)
def test_every_measurement_in_the_prose_has_a_source(page):
    with open(osp.join(ROOT, page)) as f:
        text = f.read()
    values = sources(page, text)
    allowed = ALLOWED.get(page, {})
    missing = [f'{printed!r} in: {line[:100]}'
               for printed, line in measurements(text)
               if printed not in allowed and not _sourced(printed, values)]
    assert not missing, (
        f'{page}: numbers without a source (name the docs/data file that '
        'holds them, or remove them):\n' + '\n'.join(missing))


def test_the_rule_finds_measurements_and_skips_the_rest():
    """The rule on sentences whose verdict is known by reading them."""
    got = [p for p, _ in measurements(
        'AP50 0.404 after 20 epochs; set-up 57-311 s; 1.16-1.64x the time; '
        'a 25 x 42 grid, 1024x1024 images, PyTorch 2.11, mmcv 2.1.0, '
        'tolerance 1e-4, `0.5 in code`, mmseg 1.2.x, 245 MiB.\n```\n0.119\n'
        '```\n')]
    assert got == ['0.404', '57 s', '311 s', '1.16x', '1.64x', '245 MiB']
    assert _sourced('0.40', {0.404}) and not _sourced('0.41', {0.404})
