"""Shared test settings: offline, single-threaded, and every file the package writes goes to a temporary folder."""
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
os.environ.setdefault('MPLBACKEND', 'Agg')

import pytest  # noqa: E402


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    "A private DEPTHBENCH_RUNS folder for tests that write run records."
    d = tmp_path / 'runs'
    monkeypatch.setenv('DEPTHBENCH_RUNS', str(d))
    return d


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory):
    """The offline default data (source 'sample', tokenizer 'bpe:4096': what the tiny preset trains on), prepared
    once per test session into a folder shared by xdist workers (prepare is locked and idempotent); returns its path."""
    from depthbench_nb.config import DataConfig
    from depthbench_nb.data import prepare
    folder = tmp_path_factory.getbasetemp().parent / 'depthbench-data' / 'sample-bpe4096'
    return prepare(DataConfig(source='sample', tokenizer='bpe:4096', path=str(folder)), progress=False)
