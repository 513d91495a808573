"""tools/benchmark/rtdetr_latency.py runs its rows (the quick-start model,
small sizes, one repeat) and writes them; no time is checked."""
import importlib.util
import json
import os.path as osp

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))


def test_rows_of_every_part_size_and_encoding(tmp_path):
    path = osp.join(ROOT, 'tools', 'benchmark', 'rtdetr_latency.py')
    spec = importlib.util.spec_from_file_location('mmpe_rtdetr_latency', path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / 'latency.json'
    tool.main(['--quick', '--encodings', 'sine', 'lookhere', '--out',
               str(out)])
    with open(out) as f:
        result = json.load(f)
    rows = {(r['part'], r['size'], r['encoding']): r for r in result['rows']}
    assert set(rows) == {(part, size, encoding)
                         for part in ('model', 'aifi') for size in (64, 128)
                         for encoding in ('sine', 'lookhere')}
    assert all(rows[(p, s, 'sine')]['x_sine'] == 1.0
               for p, s, _ in rows)
    assert result['env']['load_avg_end'] is not None
