"""Sphinx configuration of mmpe's documentation (``make docs``).

Markdown pages (MyST), the furo theme, and an API reference that autodoc
builds from the docstrings of the registered modules (so mmpe, torch, mmdet
and mmseg must import: build with the repository's .venv).
"""
import os
import os.path as osp
import sys

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..'))
# the checkout's mmpe, not another installed copy
sys.path.insert(0, ROOT)
os.environ.setdefault('OMP_NUM_THREADS', '1')

from mmpe.version import __version__  # noqa: E402

project = 'mmpe'
copyright = 'mmpe contributors'
version = release = __version__

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx.ext.viewcode',
]
source_suffix = {'.md': 'markdown'}
root_doc = 'index'
# docs/data holds the figures' input files (JSON), not pages
exclude_patterns = ['_build', 'data', 'Thumbs.db', '.DS_Store']

# GitHub-style anchors for headings (#what-the-demo-reaches), so that the same
# links work on GitHub and in the built site; tests/test_docs checks them.
myst_heading_anchors = 6

suppress_warnings = [
    # docs/data/ablation.md, which docs/ablation.md includes, is written by
    # tools/experiments/ablation.py --markdown with level-3 headings (tables
    # meant to be pasted into a page), and some
    # pages go from level 2 to level 4 headings; neither breaks a link.
    'myst.header',
]

# API reference: Google-style docstrings (the project's style)
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = 'bysource'
autodoc_typehints = 'description'
autodoc_default_options = {'show-inheritance': True}

html_theme = 'furo'
html_title = f'mmpe {release}'
html_static_path = ['_static']
html_show_sourcelink = False
