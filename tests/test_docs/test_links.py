"""The README and the docs pages point at things that exist.

* every relative link and image (``[text](path#anchor)``, ``![alt](path)``,
  ``<img src=...>``, MyST ``{figure}`` paths) resolves to a file of the
  repository, and every ``#anchor`` to a heading of its page, with the
  anchors GitHub and MyST (``myst_heading_anchors``) give headings: lower
  case, characters other than letters, digits, ``_``, ``-`` and spaces
  dropped, each space a ``-``, ``-1``, ``-2``, ... for repeats;
* every config (``configs/....py``) and tool (``tools/....py`` / ``.sh``)
  named anywhere in them, code blocks included, exists;
* the figures' data files (``docs/data/*.json``) name a published section
  that exists.

Fast: text only, no Sphinx (``make docs`` builds the site with -W).
"""
import glob
import json
import os.path as osp
import re
from typing import Dict, List, Set, Tuple

import pytest

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
FENCE = re.compile(r'^\s*(```+|~~~+)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')
# [text](target) and ![alt](target); target without spaces, optional title
LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?'
                  r'(?:\s+"[^"]*")?\s*\)')
IMG_TAG = re.compile(r'<img\s[^>]*src="([^"]+)"')
FIGURE = re.compile(r'^\s*```+\{(?:figure|image)\}\s+(\S+)')
INLINE_CODE = re.compile(r'`[^`\n]*`')
CONFIG = re.compile(r'(?<![\w/.-])(configs/[\w./+-]*?\.py)\b')
TOOL = re.compile(r'(?<![\w/.-])(tools/[\w./-]*?\.(?:py|sh))\b')
EXTERNAL = re.compile(r'^[a-z][a-z0-9+.-]*:', re.IGNORECASE)

# Paths the pages name that are not files of the repository, on purpose.
NOT_FILES = {
    # results.md: a copy of the quick-start config that the reader makes
    # ("a copy of configs/quickstart/detr_irpe_r18_synthetic.py with
    # '../_base_/irpe_tables/imagenet.py' in its _base_")
    'configs/quickstart/detr_irpe_r18_synthetic_imagenet-tables.py',
}


def markdown_files() -> List[str]:
    files = [osp.join(ROOT, 'README.md')]
    files += sorted(
        p for p in glob.glob(osp.join(ROOT, 'docs', '**', '*.md'),
                             recursive=True)
        if not osp.relpath(p, ROOT).startswith(osp.join('docs', '_build')))
    return files


def slugify(title: str) -> str:
    """The anchor of a heading (GitHub's and MyST's default slug)."""
    # a link in a heading contributes its text only
    title = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', title)
    return re.sub(r'[^\w\- ]', '', title.strip().lower()).replace(' ', '-')


def split_text(text: str) -> Tuple[List[str], List[str]]:
    """(lines outside code fences, fence opening lines)."""
    prose, fences = [], []
    in_fence = None
    for line in text.split('\n'):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)[0] * 3
            if in_fence is None:
                in_fence = mark
                fences.append(line)
                continue
            if line.strip().startswith(in_fence) and \
                    line.strip().strip(mark[0]) == '':
                in_fence = None
                continue
        if in_fence is None:
            prose.append(line)
    return prose, fences


_ANCHORS: Dict[str, Set[str]] = {}


def anchors(path: str) -> Set[str]:
    """Every heading anchor of a Markdown file."""
    if path not in _ANCHORS:
        with open(path) as f:
            prose, _ = split_text(f.read())
        seen: Dict[str, int] = {}
        found = set()
        for line in prose:
            m = HEADING.match(line)
            if not m:
                continue
            slug = slugify(m.group(2))
            if slug in seen:
                seen[slug] += 1
                found.add(f'{slug}-{seen[slug]}')
            else:
                seen[slug] = 0
                found.add(slug)
        _ANCHORS[path] = found
    return _ANCHORS[path]


def link_targets(path: str) -> List[str]:
    with open(path) as f:
        prose, fences = split_text(f.read())
    targets = []
    for line in prose:
        line = INLINE_CODE.sub('', line)
        targets += LINK.findall(line) + IMG_TAG.findall(line)
    for line in fences:
        m = FIGURE.match(line)
        if m:
            targets.append(m.group(1))
    return targets


def check_target(page: str, target: str, root: str = ROOT) -> str:
    """'' when ``target`` (relative to ``page``) resolves to a file of the
    repository ``root`` (and its anchor to a heading), else why not."""
    if EXTERNAL.match(target):
        return ''
    file_part, _, anchor = target.partition('#')
    dest = page if not file_part else osp.normpath(
        osp.join(osp.dirname(page), file_part))
    if not osp.exists(dest):
        return f'{target}: no file {osp.relpath(dest, root)}'
    if not osp.realpath(dest).startswith(osp.realpath(root) + osp.sep):
        return f'{target}: outside the repository'
    if anchor:
        if not dest.endswith('.md'):
            return f'{target}: an anchor into a file that is not Markdown'
        if anchor not in anchors(dest):
            return (f'{target}: no heading with anchor #{anchor} in '
                    f'{osp.relpath(dest, root)}')
    return ''


PAGES = markdown_files()


def _id(path: str) -> str:
    return osp.relpath(path, ROOT)


def test_pages_found():
    names = {_id(p) for p in PAGES}
    assert {'README.md', 'docs/index.md', 'docs/results.md'} <= names


@pytest.mark.parametrize('page', PAGES, ids=_id)
def test_relative_links_and_anchors_resolve(page):
    problems = [
        p for p in (check_target(page, t) for t in link_targets(page)) if p
    ]
    assert not problems, f'{_id(page)}:\n  ' + '\n  '.join(problems)


@pytest.mark.parametrize('page', PAGES, ids=_id)
def test_named_configs_and_tools_exist(page):
    with open(page) as f:
        text = f.read()
    named = set(CONFIG.findall(text)) | set(TOOL.findall(text))
    missing = sorted(p for p in named - NOT_FILES
                     if not osp.isfile(osp.join(ROOT, p)))
    assert not missing, f'{_id(page)} names files that do not exist: ' \
        f'{missing}'


def test_figure_data_name_their_published_section():
    files = sorted(glob.glob(osp.join(ROOT, 'docs', 'data', '*.json')))
    for path in files:
        with open(path) as f:
            data = json.load(f)
        sources = data.get('sources') or {'': data.get('source')}
        for name, source in sources.items():
            assert source, f'{_id(path)}: no source'
            published = source.get('published')
            if published is None:  # a run's own log (demo_scalars.json)
                assert source.get('command'), f'{_id(path)} {name}'
                continue
            assert source.get('date') and source.get('command'), \
                f'{_id(path)} {name}: date and command'
            target = published.split()[0]  # "docs/x.md#anchor (note)"
            problem = check_target(osp.join(ROOT, 'x'), target)
            assert not problem, f'{_id(path)} {name}: {problem}'


# the rules above, on examples whose answers GitHub gives
@pytest.mark.parametrize('title,slug', [
    ('Quick-start DETR-iRPE (`make demo`)',
     'quick-start-detr-irpe-make-demo'),
    ("Semantic segmentation: CPVT's size claim (`cpvt_seg`)",
     'semantic-segmentation-cpvts-size-claim-cpvt_seg'),
    ('One self-attention layer, 25x42 (L = 1050)',
     'one-self-attention-layer-25x42-l--1050'),
    ('Which position encoding for a DETR-family encoder (`encoder_pe`)',
     'which-position-encoding-for-a-detr-family-encoder-encoder_pe'),
    ('See [the guide](x.md) now', 'see-the-guide-now'),
])
def test_slug_rules(title, slug):
    assert slugify(title) == slug


def test_checker_finds_broken_links(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('# Title\n\n## Second part\n\n```bash\n# not a heading'
                    '\n```\n')
    assert anchors(str(page)) == {'title', 'second-part'}
    root = str(tmp_path)
    assert check_target(str(page), '#second-part', root) == ''
    assert 'no heading' in check_target(str(page), '#not-a-heading', root)
    assert 'no file' in check_target(str(page), 'missing.md', root)
    assert 'outside' in check_target(str(page), 'page.md', str(tmp_path / 'x'))
