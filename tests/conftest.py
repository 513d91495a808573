"""Test-wide setup: mmdet's registries with the mmdet default scope (as a
config with ``default_scope='mmdet'`` gives the Runner), then mmpe; the data
set check's cache (``XDG_CACHE_HOME``) in a temporary folder, for the tests
and the tools they start, never the user's; and the ``timm`` fixture: the
real timm with the torchvision stand-in of ``tests/timm_stub.py`` (why it
exists is said there); every test starts from the same state of the global
random generators, whatever ran before it, and from mmcv's own default of
``MultiheadAttention(dropout_layer=...)``; ``free_port``; opt-in tests
(``@pytest.mark.opt_in('ENV_VAR')``) deselected unless ``ENV_VAR=1``."""
import os
import random
import socket

import numpy as np
import torch

# No GPU: Triton's interpreter runs the CUDA attention kernel on CPU tensors
# (test_triton_attention.py). Triton reads this when the kernels are
# defined, at `import mmpe` below.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

from mmdet.utils import register_all_modules

register_all_modules(init_default_scope=True)

import mmpe  # noqa: E402,F401

import pytest  # noqa: E402
from mmcv.cnn.bricks.transformer import MultiheadAttention  # noqa: E402

from timm_stub import import_timm  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Deselect (not skip) the tests marked ``opt_in(ENV_VAR)`` unless
    ``ENV_VAR=1``: a skip in ``make test`` means something is missing, so
    the suite's summary keeps skips for what this machine cannot run (CUDA)
    and counts the long opt-in cases as deselected."""
    keep, dropped = [], []
    for item in items:
        marker = item.get_closest_marker('opt_in')
        off = marker is not None and os.environ.get(marker.args[0]) != '1'
        (dropped if off else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope='session', autouse=True)
def _cache_in_a_temporary_folder(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:  # restored after the session
        patch.setenv('XDG_CACHE_HOME',
                     str(tmp_path_factory.mktemp('xdg_cache')))
        yield


def _seed_global_generators():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope='session', autouse=True)
def _global_generators_seeded_for_the_session():
    """Seed 0 before the first fixture or test; the process's states again
    after the session."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    _seed_global_generators()
    yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])


@pytest.fixture(autouse=True)
def _global_generators_seeded_per_test():
    """random, numpy and torch at seed 0 when a test starts and again when it
    ends (so also for the module fixtures set up between tests): a test's
    draws never depend on which tests ran before it, in file order or
    shuffled. With ``-p randomly``, pytest-randomly then reseeds random and
    numpy just before the test body from ``--randomly-seed`` and the test's
    id, also independent of the order; kept (no ``--randomly-dont-reset-
    seed``), since only the printed seed decides the draws, and a failure
    replays from it. torch stays at seed 0 in both modes: a shuffled run
    checks independence of the order, not tolerances on other inputs."""
    _seed_global_generators()
    yield
    _seed_global_generators()


# mmcv 2.1.0's MultiheadAttention, given the deprecated ``dropout`` key
# (mmdet's DETR configs use it), writes that value into its default
# ``dropout_layer`` dict, so every later mmcv MultiheadAttention built without
# ``dropout_layer`` in the process gets that dropout.
_MMCV_MHA_DROPOUT_LAYER = next(
    d for d in MultiheadAttention.__init__.__defaults__ if isinstance(d, dict))
_MMCV_MHA_DROPOUT_LAYER_AT_IMPORT = dict(_MMCV_MHA_DROPOUT_LAYER)


@pytest.fixture(autouse=True)
def _mmcv_attention_default_given_back():
    """Each test starts with mmcv's default ``dropout_layer`` as mmcv
    defines it (Dropout(0)), whatever configs earlier tests built: a test
    that builds a DETR config leaves it at 0.1 otherwise, and a later test's
    ``MultiheadAttention`` in training mode draws dropout that its reference
    does not (a shuffled run's failure). Given back when the test starts
    (after the module fixtures) and when it ends."""
    _give_back_mmcv_attention_default()
    yield
    _give_back_mmcv_attention_default()


def _give_back_mmcv_attention_default():
    _MMCV_MHA_DROPOUT_LAYER.clear()
    _MMCV_MHA_DROPOUT_LAYER.update(_MMCV_MHA_DROPOUT_LAYER_AT_IMPORT)


@pytest.fixture
def free_port():
    """A TCP port on 127.0.0.1 that no process listens on, from the OS
    (bind to port 0), for a launcher's rendezvous: a fixed port, or one
    derived from the pid, collides with another job on the machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture(scope='session')
def timm():
    """The real timm (random weights only: ``pretrained=False``), imported
    with the torchvision stand-in of ``tests/timm_stub.py``."""
    return import_timm()
