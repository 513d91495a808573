"""mmpe.utils.tool_args: the options tools/train.py, tools/test.py and the
other tools share, parsed as mmdet's tools parse them."""
import argparse
import os

import pytest
from mmengine.config import DictAction

from mmpe.utils.tool_args import (LAUNCHERS, add_cfg_options, add_launcher,
                                  add_runner_args, add_unsafe_checkpoint,
                                  parse_tool_args)


def test_runner_args_parse_as_mmdet_tools_do(monkeypatch):
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    add_runner_args(parser)
    args = parse_tool_args(parser, [
        'cfg.py', '--allow-unsafe-checkpoint', '--launcher', 'pytorch',
        '--local-rank', '3', '--cfg-options', 'a.b=1', 'c=[1,2]'
    ])
    # mmengine's own DictAction on the same words
    want = argparse.Namespace()
    DictAction(option_strings=['--cfg-options'], dest='cfg_options')(
        None, want, ['a.b=1', 'c=[1,2]'])
    assert args.cfg_options == want.cfg_options == {'a.b': 1, 'c': [1, 2]}
    assert args.allow_unsafe_checkpoint and args.launcher == 'pytorch'
    assert args.local_rank == 3
    assert os.environ['LOCAL_RANK'] == '3'


def test_defaults_and_a_launcher_set_rank(monkeypatch):
    monkeypatch.setenv('LOCAL_RANK', '1')  # torchrun's
    parser = argparse.ArgumentParser()
    add_runner_args(parser)
    args = parse_tool_args(parser, ['--local_rank', '0'])
    assert (args.allow_unsafe_checkpoint, args.cfg_options,
            args.launcher) == (False, None, 'none')
    assert os.environ['LOCAL_RANK'] == '1'


def test_bad_launcher_names_the_choices(capsys):
    parser = argparse.ArgumentParser()
    add_launcher(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(['--launcher', 'torchrun'])
    err = capsys.readouterr().err
    assert "'torchrun'" in err and all(f"'{c}'" in err for c in LAUNCHERS)


def test_parts_without_launcher_leave_rank_alone(monkeypatch):
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    parser = argparse.ArgumentParser()
    add_unsafe_checkpoint(parser)
    add_cfg_options(parser)
    args = parse_tool_args(parser, [])
    assert not hasattr(args, 'local_rank')
    assert 'LOCAL_RANK' not in os.environ
