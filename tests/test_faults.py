"""The fault suite: faults lose nothing and run nothing.

kill -9 anywhere in a run (between checkpoints, at one, in the middle of writing one, before the result) resumes
to the record of an uninterrupted run; a sweep whose driver is killed twice finishes every run exactly once; one
writer per run folder; a damaged checkpoint is survived; nothing read from a run folder or a checkpoint runs code;
a sweep whose runs crash exits non-zero and lists them; bad input is one clear error (JSON with --json) and leaves
no empty run folder. Marked `faults` (CI runs it: `scripts/test.sh` deselects nothing); run it alone with
`pytest -m faults`. The session's summary line (`conftest.py`) adds up the faults injected, the runs that
survived them and the records lost (must be 0).

Every fault is injected into a real process: the killed trainer is `depthbench-nb train` in a child process whose
own code kills itself (SIGKILL) at the chosen point, the kill points and the trials drawn from a seeded RNG."""
import dataclasses
import hashlib
import io
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from depthbench_nb.cli import main
from depthbench_nb.runs import list_checkpoints, load_run, read_metrics, read_result, run_dir
from depthbench_nb.trainer import make_run_config, train

pytestmark = pytest.mark.faults

TIMING = ('tokens_per_s', 'peak_mem_bytes', 'mfu')        # wall-clock measurements: the only fields a resume changes
CLI = [sys.executable, '-c', 'import sys; from depthbench_nb.cli import main; sys.exit(main())']


# ------------------------------------------------------------------------------------------------------ helpers
def lock_holder(folder: Path):
    "The pid in a run folder's lock record while a live writer holds it (read from the file, as a person would)."
    try: rec = json.loads((Path(folder) / '.lock').read_text() or 'null')
    except (OSError, ValueError): return None
    if not isinstance(rec, dict) or rec.get('released'): return None
    try: os.kill(rec['pid'], 0)
    except ProcessLookupError: return None
    return rec['pid']


def ledger(faults: int = 0, runs: int = 0, survived: int = 0, lost: int = 0) -> None:
    "Add to the session's fault summary (printed by conftest.py at the end of the run)."
    path = os.environ.get('DEPTHBENCH_FAULT_LEDGER')
    if path:
        with open(path, 'a') as f: f.write(json.dumps(dict(faults=faults, runs=runs, survived=survived, lost=lost)) + '\n')


def tiny(data, steps: int = 12, study: str = 'faults', seed: int = 42, **kw):
    "A CPU-sized run (L2 d32, 4 x 32 tokens per step) with checkpoints every 3 steps, the newest 2 kept."
    kw.setdefault('checkpoint_every', 3); kw.setdefault('eval_every', 4)
    run = make_run_config('preln', L=2, d_model=32, preset='tiny', max_steps=steps, study=study, seed=seed,
                          data=str(data), verbose=False, **kw)
    return run.replace(train=run.train.replace(seq_len=32, global_batch=4, eval_batches=1, keep_checkpoints=2))


def deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def lost_records(got: list[dict], want: list[dict]) -> int:
    "Rows of the uninterrupted record missing from (or changed in) a resumed one, plus rows it holds twice or extra."
    g, w = [json.dumps(r, sort_keys=True) for r in deterministic(got)], [json.dumps(r, sort_keys=True) for r in deterministic(want)]
    return sum(max(0, w.count(x) - g.count(x)) for x in set(w)) + max(0, len(g) - len(w))


def weights_digest(folder: Path) -> str:
    return hashlib.sha256((list_checkpoints(folder)[-1][1] / 'model.safetensors').read_bytes()).hexdigest()


def planted_pickle(marker: Path, zip_format: bool = False) -> bytes:
    "A pickle whose __reduce__ calls os.system (touch marker): what someone who can write to a runs folder would plant."
    class Planted:
        def __reduce__(self): return (os.system, (f'touch {marker}',))
    if not zip_format: return pickle.dumps(Planted(), protocol=2)
    buf = io.BytesIO(); torch.save({'state': Planted()}, buf)          # torch's own zip layout, with the payload inside
    return buf.getvalue()


def run_cli(args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=timeout)


def json_error(capsys, argv: list[str]) -> dict:
    "Run `depthbench-nb ARGV --json` in this process: exit 2, stdout exactly one {error, kind} object, no traceback."
    capsys.readouterr()                                            # what earlier steps of the test printed
    rc = main(argv + ['--json'])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    obj = json.loads(out)
    assert set(obj) == {'error', 'kind'} and 'Traceback' not in err, (out, err)
    return obj


@pytest.fixture(scope='module')
def reference(tiny_data, tmp_path_factory):
    "The uninterrupted record of the tiny run: metrics, result and final weights."
    runs = tmp_path_factory.mktemp('reference')
    old = os.environ.get('DEPTHBENCH_RUNS'); os.environ['DEPTHBENCH_RUNS'] = str(runs)
    try:
        run = tiny(tiny_data)
        res = train(run, progress=False)
        return dict(run=run, rows=read_metrics(run_dir(run)), result=res, digest=weights_digest(run_dir(run)))
    finally:
        if old is None: del os.environ['DEPTHBENCH_RUNS']
        else: os.environ['DEPTHBENCH_RUNS'] = old


# --------------------------------------------------------------------------------------- kill -9 at random points
KILLER = r'''
import json, os, signal, sys
point, step = os.environ['DEPTHBENCH_TEST_KILL'].split(':'); step = int(step)
import torch
import depthbench_nb.runs as R
import depthbench_nb.trainer as T
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if point == 'row':                 # between checkpoints: after step's row, half of the next row on disk
    append = R.MetricsLog.append
    def hook(self, row):
        append(self, row)
        if row['step'] == step:
            with open(self.path, 'a') as f: f.write('{"step": %d, "loss": 3.' % (step + 1))
            die()
    R.MetricsLog.append = hook
elif point == 'in-write':          # in the middle of writing checkpoint `step`: weights done, train state half written
    save = torch.save
    def hook(obj, f, *a, **k):
        save(obj, f, *a, **k)
        if f'.tmp-step_{step:08d}' in str(f):
            data = open(f, 'rb').read(); open(f, 'wb').write(data[:len(data) // 2]); die()
    torch.save = hook
elif point == 'before-rename':     # checkpoint `step` complete with its checksums, not yet renamed into place
    sums = R.write_checksums
    def hook(folder, names):
        out = sums(folder, names)
        if f'.tmp-step_{step:08d}' in str(folder): die()
        return out
    R.write_checksums = hook
elif point == 'at-checkpoint':     # right after checkpoint `step` landed
    save_ckpt = T.save_checkpoint
    def hook(folder, s, *a, **k):
        out = save_ckpt(folder, s, *a, **k)
        if s == step: die()
        return out
    T.save_checkpoint = hook
elif point == 'before-result':     # the last checkpoint written, result.json not yet
    T.write_result = lambda *a, **k: die()
from depthbench_nb.cli import main
sys.exit(main(sys.argv[1:]))
'''
KILL_POINTS = ('row', 'in-write', 'before-rename', 'at-checkpoint', 'before-result', 'time')


def kill_run(params: Path, folder: Path, env: dict, point: str, step: int, rng: random.Random) -> subprocess.CompletedProcess:
    "Train the run of `params` in a child process that is killed with SIGKILL at `point` (a seeded time for 'time')."
    cmd = [sys.executable, '-c', KILLER, 'train', '--run-config', str(params), '--no-progress']
    if point != 'time':
        res = subprocess.run(cmd, env=dict(env, DEPTHBENCH_TEST_KILL=f'{point}:{step}'), capture_output=True, text=True, timeout=300)
        assert res.returncode == -signal.SIGKILL, (point, step, res.returncode, res.stdout[-1500:], res.stderr[-1500:])
        return res
    proc = subprocess.Popen(cmd, env=dict(env, DEPTHBENCH_TEST_KILL='none:0'), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300                                  # a fresh run: wait for `step` rows, then a seeded delay
    while len(read_metrics(folder)) < step and proc.poll() is None and time.time() < deadline: time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.05))
    proc.kill(); out = proc.communicate()[0]
    assert proc.returncode == -signal.SIGKILL, ('the run ended before its kill', out[-1500:])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, '')


def test_kill_minus_9_anywhere_resumes_to_the_uninterrupted_record(reference, tmp_path, monkeypatch, capsys):
    """Six seeded trials, one per kind of kill point first (a random moment, between checkpoints, in the middle of a
    checkpoint write, before its rename, right after it, before the result), then maybe a second kill at a later
    random point; the resumed metrics.jsonl, result and final weights equal the uninterrupted run's."""
    rng = random.Random(16)
    run, steps = reference['run'], reference['run'].train.max_steps
    ckpt_steps = list(range(3, steps + 1, 3))
    faults = lost = 0
    for trial, first in enumerate(KILL_POINTS):
        runs = tmp_path / f'trial{trial}'
        monkeypatch.setenv('DEPTHBENCH_RUNS', str(runs))
        env = dict(os.environ, OMP_NUM_THREADS='1')
        folder = run_dir(run)
        params = runs / 'run.json'; runs.mkdir(); params.write_text(json.dumps(run.to_dict()))
        kills, last = [], 0
        for point in [first] + ([rng.choice(KILL_POINTS[:5])] if first not in ('before-result',) and rng.random() < 0.6 else []):
            if point == 'time': step = rng.randint(1, 6)                 # rows to wait for, then a random delay
            elif point == 'row':
                if last > steps - 1: break
                step = rng.randint(last, steps - 1)
            elif point == 'before-result': step = steps
            else:
                later = [c for c in ckpt_steps if c > last]
                if not later: break
                step = rng.choice(later)
            res = kill_run(params, folder, env, point, step, rng)
            kills.append((point, step)); faults += 1
            last = max(step, len(read_metrics(folder))) + 1
            if point == 'before-result': break
        capsys.readouterr()
        result = train(run, progress=False)                                  # resume in this process, to the end
        said = capsys.readouterr().out
        got = read_metrics(folder)
        lost += lost_records(got, reference['rows'])
        assert deterministic(got) == deterministic(reference['rows']), (trial, kills)
        keys = ('status', 'steps', 'tokens', 'final_val_loss', 'best_val_loss')
        assert {k: result[k] for k in keys} == {k: reference['result'][k] for k in keys}, (trial, kills)
        assert weights_digest(folder) == reference['digest'], (trial, kills)         # bit-identical final weights
        assert 'took over the lock of pid' in said and 'which no longer runs' in said, said  # the killed writer's lock
        if kills[-1][0] in ('in-write', 'before-rename'): assert 'temporary checkpoint folder' in said, said
        assert not list((folder / 'checkpoints').glob('.tmp-step_*'))
        print(f'trial {trial}: kills {kills}: resumed to the same record')
    ledger(faults=faults, runs=len(KILL_POINTS), survived=len(KILL_POINTS), lost=lost)
    assert lost == 0


# --------------------------------------------------------------------------------- 1. one writer per run folder
def test_two_identical_train_commands_have_one_writer(tiny_data, runs_dir, tmp_path, capsys, monkeypatch):
    """Two writers of one run: the same `train` twice at once. One trains; the other is refused naming it (or, with
    --wait, waits and reports the finished run); metrics.jsonl holds every step once."""
    args = ['train', '--arch', 'preln', '--L', '2', '--preset', 'tiny', '--max-steps', '12', '--checkpoint-every', '4',
            '--data', str(tiny_data), '--json']     # 12 steps (the same race, less CPU)
    env = dict(os.environ, OMP_NUM_THREADS='1')
    procs = [subprocess.Popen(CLI + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    folders = lambda: [p for p in (runs_dir / 'default').glob('preln-*') if p.is_dir()]
    deadline = time.time() + 120                                   # until one of them is training
    while time.time() < deadline and not (folders() and read_metrics(folders()[0])):
        assert any(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)
    folder = folders()[0]
    # meanwhile a third, in this process: refused, the holder named; with --wait it returns the holder's result
    busy = json_error(capsys, args[:-1])
    holder = int(busy['error'].split(' pid ')[1].split()[0])
    assert busy['kind'] == 'busy' and holder in [p.pid for p in procs] and '--wait' in busy['error'], busy
    assert main(args + ['--wait']) == 0
    waited = json.loads(capsys.readouterr().out)
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    winner = [o for p, o in zip(procs, outs) if p.pid == holder][0]
    loser = [o for p, o in zip(procs, outs) if p.pid != holder][0]
    assert winner[0] == 0 and json.loads(winner[1])['status'] == 'completed'
    assert waited == json.loads(winner[1])                         # the finished record, not a second training
    if loser[0] == 2:                                              # refused while the winner trained ...
        err = json.loads(loser[1]); assert err['kind'] == 'busy' and f'pid {holder}' in err['error'], loser
    else:                                                          # ... or came after it and found the run complete
        assert loser[0] == 0 and 'already completed' in loser[2], loser
    steps = [r['step'] for r in read_metrics(folder)]
    assert steps == list(range(12)), steps                         # every step exactly once
    ledger(faults=2, runs=1, survived=1, lost=len(steps) - len(set(steps)) + 12 - len(set(steps)))


def test_lock_where_the_filesystem_has_no_flock(tmp_path, monkeypatch):
    "Without flock (some NFS and Lustre mounts) the lock record is the lock: held, stale (dead pid) or on another host."
    import errno
    import fcntl
    import socket
    from depthbench_nb.config import RunBusy
    from depthbench_nb.runs import RunFolderLock, run_folder_holder
    def no_flock(fd, op): raise OSError(errno.ENOLCK, 'No locks available')
    monkeypatch.setattr(fcntl, 'flock', no_flock)
    folder = tmp_path / 'study' / 'run'
    with RunFolderLock(folder, say=lambda m: None) as a:
        assert a.mode == 'link' and run_folder_holder(folder)['pid'] == os.getpid()
        with pytest.raises(RunBusy, match=f'pid {os.getpid()}'): RunFolderLock(folder).acquire()
    assert not (folder / '.lock').exists()                          # released: the record is gone
    dead = subprocess.Popen(['true']); dead.wait()
    (folder / '.lock').write_text(json.dumps(dict(pid=dead.pid, host=socket.gethostname(), released=False, since='then')))
    assert run_folder_holder(folder) is None                        # its process is gone: nobody writes the run
    with RunFolderLock(folder, say=lambda m: None) as b: assert b.took_over['pid'] == dead.pid   # stale: taken over
    (folder / '.lock').write_text(json.dumps(dict(pid=1, host='other-node', released=False, since='then')))
    assert run_folder_holder(folder)['host'] == 'other-node'        # another host: cannot tell, so it counts as held
    with pytest.raises(RunBusy, match=r'other-node.*delete .*\.lock'): RunFolderLock(folder).acquire()


# ------------------------------------------------------------------------- 2. a damaged checkpoint is survived
@pytest.fixture
def stopped_run(reference, tiny_data, runs_dir):
    "The tiny run stopped after step 8: checkpoints 6 and 8 (the newest two), no result."
    run = reference['run']
    assert train(run, progress=False, stop_after=8)['status'] == 'stopped'
    assert [s for s, _ in list_checkpoints(run_dir(run))] == [6, 8]
    return run


@pytest.mark.parametrize('damage', ['model.safetensors', 'train_state.pt', 'meta.json', 'SHA256SUMS'])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(reference, stopped_run, damage, capsys):
    folder = run_dir(stopped_run)
    newest = list_checkpoints(folder)[-1][1]
    data = (newest / damage).read_bytes(); (newest / damage).write_bytes(data[:len(data) // 2])   # truncated
    stale = folder / 'checkpoints' / '.tmp-step_00000009-4242'; stale.mkdir(); (stale / 'model.safetensors').write_bytes(b'half')
    capsys.readouterr()
    res = train(stopped_run, progress=False)
    said = capsys.readouterr().out
    assert res['status'] == 'completed'
    assert f'step_00000008 is damaged ({damage}' in said and 'resuming from the newest intact checkpoint instead, step_00000006' in said
    assert 'removed 1 temporary checkpoint folder' in said and not stale.exists()
    assert (folder / 'checkpoints' / 'corrupt-step_00000008').is_dir()                # kept for inspection, out of the way
    assert deterministic(read_metrics(folder)) == deterministic(reference['rows'])   # the same record as without the fault
    assert weights_digest(folder) == reference['digest']
    ledger(faults=2, runs=1, survived=1, lost=lost_records(read_metrics(folder), reference['rows']))


def test_load_run_skips_a_damaged_checkpoint(stopped_run, capsys):
    folder = run_dir(stopped_run)
    w = list_checkpoints(folder)[-1][1] / 'model.safetensors'; w.write_bytes(w.read_bytes()[:-16])
    model, _ = load_run(folder)                                                  # reads, never moves anything
    assert 'step_00000008 is damaged' in capsys.readouterr().err and [s for s, _ in list_checkpoints(folder)] == [6, 8]
    from depthbench_nb.costs import measured_costs                               # diagnose's reading of the metrics
    with open(folder / 'metrics.jsonl', 'a') as f: f.write('{"step": 8, "loss": 3.')   # a writer killed mid-line
    assert measured_costs(folder)['steps'] == 8


def _to_format_1(ckpt: Path) -> None:
    "Rewrite a checkpoint as checkpoints were written before checksums: numpy/Python RNG pickled, no SHA256SUMS."
    import numpy as np
    st = torch.load(ckpt / 'train_state.pt', weights_only=True)
    n, p = st['rng']['numpy'], st['rng']['python']
    st['rng']['numpy'] = ('MT19937', n['key'].numpy().astype(np.uint32), n['pos'], n['has_gauss'], n['gauss'])
    st['rng']['python'] = (p['version'], tuple(p['state'].tolist()), p['gauss_next'])
    torch.save(st, ckpt / 'train_state.pt')
    meta = json.loads((ckpt / 'meta.json').read_text()); del meta['format']
    (ckpt / 'meta.json').write_text(json.dumps(meta)); (ckpt / 'SHA256SUMS').unlink()


def test_checkpoints_written_before_checksums_still_resume(reference, stopped_run, capsys):
    folder = run_dir(stopped_run)
    for _, ckpt in list_checkpoints(folder): _to_format_1(ckpt)
    old = list_checkpoints(folder)[-1][1] / 'train_state.pt'
    assert torch.serialization.get_unsafe_globals_in_checkpoint(old)                # numpy arrays in the pickle
    res = train(stopped_run, progress=False)
    assert res['status'] == 'completed' and 'resuming from checkpoint step 8' in capsys.readouterr().out
    assert deterministic(read_metrics(folder)) == deterministic(reference['rows'])
    assert weights_digest(folder) == reference['digest']


# ------------------------------------------------------------------------------- 3. nothing read runs code
def test_resume_never_runs_a_planted_train_state(reference, stopped_run, tmp_path, capsys):
    "The newest checkpoint's train_state.pt replaced by a pickle calling os.system: it never runs; the run resumes."
    folder = run_dir(stopped_run)
    marker = tmp_path / 'ran'
    (list_checkpoints(folder)[-1][1] / 'train_state.pt').write_bytes(planted_pickle(marker, zip_format=True))
    try: res = train(stopped_run, progress=False)
    finally: assert not marker.exists(), 'resuming ran code planted in the checkpoint'
    assert res['status'] == 'completed' and 'step_00000008 is damaged (train_state.pt fails its checksum' in capsys.readouterr().out
    assert deterministic(read_metrics(folder)) == deterministic(reference['rows'])
    ledger(faults=1, runs=1, survived=1, lost=lost_records(read_metrics(folder), reference['rows']))


def test_resume_refuses_a_planted_train_state_with_forged_checksums(stopped_run, tmp_path, capsys):
    "The same, its checksum forged too (a careful attacker): refused with a clear error, nothing ran."
    from depthbench_nb.config import UnsafeFile
    from depthbench_nb.runs import write_checksums
    folder = run_dir(stopped_run)
    marker = tmp_path / 'ran'
    newest = list_checkpoints(folder)[-1][1]
    (newest / 'train_state.pt').write_bytes(planted_pickle(marker, zip_format=True))
    write_checksums(newest, ['model.safetensors', 'meta.json', 'train_state.pt'])
    with pytest.raises(UnsafeFile, match=r'step_00000008/train_state.pt would run code .*posix.system.*nothing was executed'):
        train(stopped_run, progress=False)
    assert json_error(capsys, ['train', '--run-config', str(folder / 'params.json')])['kind'] == 'unsafe'
    assert not marker.exists()
    ledger(faults=1)


def test_resume_refuses_a_planted_format_1_train_state(stopped_run, tmp_path):
    folder = run_dir(stopped_run)
    for _, ckpt in list_checkpoints(folder): _to_format_1(ckpt)
    marker = tmp_path / 'ran'
    (list_checkpoints(folder)[-1][1] / 'train_state.pt').write_bytes(planted_pickle(marker, zip_format=True))
    from depthbench_nb.config import UnsafeFile
    with pytest.raises(UnsafeFile, match='posix.system'): train(stopped_run, progress=False)
    assert not marker.exists()
    ledger(faults=1)


def _dcp_with_planted_shard(folder: Path, marker: Path) -> None:
    "A torch DCP checkpoint whose index points one tensor at a planted pickle appended to its data file."
    import torch.distributed.checkpoint as dcp
    import warnings
    from depthbench_nb.interop import _DCPIndexUnpickler
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        dcp.save({'model': {'embeddings.weight': torch.ones(4, 2)}}, checkpoint_id=str(folder))
    with open(folder / '.metadata', 'rb') as f: meta = _DCPIndexUnpickler(f).load()
    (index, info), = [(k, v) for k, v in meta.storage_data.items() if k.fqn == 'model.embeddings.weight']
    blob = planted_pickle(marker, zip_format=True)
    data = folder / info.relative_path
    offset = data.stat().st_size
    with open(data, 'ab') as f: f.write(blob)
    meta.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob))
    (folder / '.metadata').write_bytes(pickle.dumps(meta))


PLACES = ['resume', 'import .pt', 'import .bin', 'import .safetensors', 'import DCP index', 'import DCP data file',
          'diagnose', 'collect result.json', 'collect params.json', 'sweep state', 'study file', 'fit CSV', 'data manifest']


@pytest.mark.parametrize('place', PLACES)
def test_a_planted_pickle_runs_nowhere(place, reference, tiny_data, runs_dir, tmp_path, capsys):
    "Each place the project reads from, fed a pickle whose __reduce__ calls os.system: nothing runs, the error is clear."
    marker = tmp_path / 'ran'
    evil, evil_zip = planted_pickle(marker), planted_pickle(marker, zip_format=True)
    run = reference['run']
    study = tmp_path / 'study.yaml'
    study.write_text(yaml.safe_dump(dict(name='faults', preset='tiny', data=str(tiny_data), groups=[
        dict(name='g', archs=['preln'], depths=[2], max_steps=1)])))
    def trained():
        r = tiny(tiny_data, steps=2, checkpoint_every=1)
        train(r, progress=False); capsys.readouterr()
        return run_dir(r)
    if place == 'resume':
        from depthbench_nb.runs import write_checksums
        folder = trained(); ckpt = list_checkpoints(folder)[-1][1]
        (folder / 'result.json').unlink()
        (ckpt / 'train_state.pt').write_bytes(evil_zip); write_checksums(ckpt, ['model.safetensors', 'meta.json', 'train_state.pt'])
        argv, kind = ['train', '--run-config', str(folder / 'params.json')], 'unsafe'
    elif place.startswith('import'):
        src = tmp_path / 'ckpt'; src.mkdir()
        if place == 'import DCP index': (src / '.metadata').write_bytes(evil); kind = 'unsafe'
        elif place == 'import DCP data file': _dcp_with_planted_shard(src, marker); kind = 'unsafe'
        else:
            ext = place.split('.')[-1]
            (src / f'model.{ext}').write_bytes(evil if ext != 'bin' else evil_zip)
            kind = 'corrupt' if ext == 'safetensors' else 'unsafe'
        argv = ['import-checkpoint', str(src), '--arch', 'preln']
    elif place == 'diagnose':
        from depthbench_nb.runs import write_checksums
        folder = trained()
        for c in list_checkpoints(folder):
            (c[1] / 'model.safetensors').write_bytes(evil); write_checksums(c[1], ['model.safetensors', 'meta.json', 'train_state.pt'])
        argv, kind = ['diagnose', str(folder), '--metrics', 'angular'], 'corrupt'
    elif place == 'collect result.json':
        from depthbench_nb.sweep import expand_study, load_study
        r = expand_study(load_study(study))[0].run
        folder = run_dir(r); folder.mkdir(parents=True)
        (folder / 'params.json').write_text(json.dumps(dict(r.to_dict(), run_id=r.run_id)))
        (folder / 'result.json').write_bytes(evil)
        argv, kind = ['collect', str(study)], 'corrupt'
    elif place == 'collect params.json':               # a run folder outside the plan: skipped, said, nothing ran
        folder = runs_dir / 'faults' / 'someone-elses-run'; folder.mkdir(parents=True)
        (folder / 'params.json').write_bytes(evil)
        assert main(['collect', str(study), '--json']) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)['rows'] == 1 and 'someone-elses-run/params.json is not valid JSON' in err, err
        assert not marker.exists()
        return ledger(faults=1)
    elif place == 'sweep state':
        from depthbench_nb.sweep import _attempts_path, expand_study, load_study
        p = _attempts_path('faults', expand_study(load_study(study))[0].run_id); p.parent.mkdir(parents=True); p.write_bytes(evil)
        argv, kind = ['sweep', 'status', str(study)], 'corrupt'
    elif place == 'study file':
        study.write_text('name: !!python/object/apply:os.system ["touch %s"]\ngroups: []\n' % marker)
        argv, kind = ['sweep', 'plan', str(study)], 'config'
    elif place == 'fit CSV':
        csv = tmp_path / 'runs.csv'; csv.write_bytes(evil)
        argv, kind = ['fit', '--csv', str(csv), '--restarts', '2'], 'corrupt'
    elif place == 'data manifest':
        data = tmp_path / 'data'; shutil.copytree(tiny_data, data); (data / 'manifest.json').write_bytes(evil)
        argv, kind = ['train', '--arch', 'preln', '--L', '2', '--preset', 'tiny', '--max-steps', '1', '--data', str(data)], 'config'
    err = json_error(capsys, argv)
    assert err['kind'] == kind, err
    assert not marker.exists(), f'{place}: the planted code ran'
    ledger(faults=1)


# ------------------------------------------------------------------- 4. a sweep that crashed says so
def test_sweep_on_an_unwritable_runs_folder_fails_before_any_run(tiny_data, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / 'a-file'; blocker.write_text('x')                  # root ignores chmod: a file in the way
    monkeypatch.setenv('DEPTHBENCH_RUNS', str(blocker / 'runs'))
    study = tmp_path / 's.yaml'
    study.write_text(yaml.safe_dump(dict(name='ro', preset='tiny', data=str(tiny_data), groups=[
        dict(name='g', archs=['preln'], depths=[2], lrs=[1e-3, 2e-3], max_steps=1)])))
    err = json_error(capsys, ['sweep', 'run', str(study), '--executor', 'python'])
    assert err['kind'] == 'config' and 'not writable' in err['error'] and 'none of the 2 runs' in err['error']


def test_sweep_with_a_crashed_worker_exits_non_zero_and_lists_the_run(tiny_data, runs_dir, tmp_path, capsys):
    "One run's lock path is blocked (the driver's thread for it crashes); the other run completes; exit 1, listed."
    from depthbench_nb.sweep import expand_study, load_study
    study = tmp_path / 's.yaml'
    study.write_text(yaml.safe_dump(dict(name='crash', preset='tiny', data=str(tiny_data), groups=[
        dict(name='g', archs=['preln'], depths=[2], lrs=[1e-3, 2e-3], max_steps=1)])))
    bad, good = expand_study(load_study(study))
    (runs_dir / 'crash' / '.sweep' / 'locks' / f'{bad.run_id}.lock').mkdir(parents=True)   # a folder where a file must go
    rc = main(['sweep', 'run', str(study), '--executor', 'python', '--json'])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [r['run_id'] for r in out['not_done']] == [bad.run_id] and 'IsADirectoryError' in out['not_done'][0]['error']
    assert read_result(run_dir(good.run))['status'] == 'completed'
    assert {o['run_id']: o['action'] for o in out['outcomes']} == {bad.run_id: 'error', good.run_id: 'ran'}
    ledger(faults=1, runs=1, survived=1)                            # the other run of the sweep went on


# ------------------------------------------------------------------ 5. clear errors, no empty run folder
def _import_inputs(tmp_path: Path, reference) -> dict:
    rnd = random.Random(16).randbytes
    torch.save({'w': torch.ones(64, 64)}, tmp_path / 'whole.pt')
    whole = (tmp_path / 'whole.pt').read_bytes()
    from safetensors.torch import save_file
    save_file({'w': torch.ones(64, 64)}, str(tmp_path / 'whole.safetensors'))
    st = (tmp_path / 'whole.safetensors').read_bytes()
    return {'random.bin': rnd(4096), 'random.pt': rnd(4096), 'random.safetensors': rnd(4096), 'empty.pt': b'',
            'truncated.pt': whole[:len(whole) // 2], 'truncated.safetensors': st[:len(st) // 2]}


BAD_INPUTS = ['fit: text in a number column', 'fit: binary CSV', 'fit: empty CSV', 'study: random bytes',
              'import: random.bin', 'import: random.pt', 'import: random.safetensors', 'import: empty.pt',
              'import: truncated.pt', 'import: truncated.safetensors']


@pytest.mark.parametrize('case', BAD_INPUTS)
def test_bad_input_is_one_clear_error(case, reference, tmp_path, capsys, runs_dir):
    if case.startswith('fit'):
        csv = tmp_path / 'runs.csv'
        csv.write_bytes({'fit: text in a number column': b'N,D,loss\n1e8,2e9,3.1\n2e8,many,3.0\n',
                         'fit: binary CSV': random.Random(1).randbytes(2048), 'fit: empty CSV': b''}[case])
        argv, kind, says = ['fit', '--csv', str(csv), '--law', 'chinchilla'], ('config', 'corrupt'), 'runs.csv'
        if 'number' in case: says = "column 'D' must hold numbers; row 1 holds 'many'"
    elif case.startswith('study'):
        (tmp_path / 's.yaml').write_bytes(random.Random(2).randbytes(2048))
        argv, kind, says = ['sweep', 'plan', str(tmp_path / 's.yaml')], ('corrupt',), 's.yaml'
    else:
        name = case.split(': ')[1]
        (tmp_path / name).write_bytes(_import_inputs(tmp_path, reference)[name])
        argv, kind, says = ['import-checkpoint', str(tmp_path / name), '--arch', 'preln'], ('corrupt',), name
    err = json_error(capsys, argv)
    assert err['kind'] in kind and says in err['error'], err
    assert main(argv) == 2                                              # without --json: one line on stderr
    out, text = capsys.readouterr()
    assert text.startswith(f'depthbench-nb {argv[0]}: error: ') and len(text.strip().splitlines()) == 1 and not out
    assert not any(p.is_dir() for p in runs_dir.glob('*/*')), 'an error left a run folder behind'


def test_an_error_after_the_run_folder_was_made_leaves_none(tiny_data, runs_dir, capsys):
    "Train with a tracker that is not installed: refused after the folder was made, and the folder is gone again."
    err = json_error(capsys, ['train', '--arch', 'preln', '--L', '2', '--d-model', '32', '--preset', 'tiny', '--max-steps', '1',
                              '--data', str(tiny_data), '--trackers', 'mlflow-x'])
    assert err['kind'] == 'config' and 'unknown tracker' in err['error']
    assert not runs_dir.exists() or not any(runs_dir.rglob('*')), list(runs_dir.rglob('*'))


def test_usage_errors_are_json_too(capsys):
    err = json_error(capsys, ['train', '--L', 'two'])
    assert err['kind'] == 'usage' and "invalid int value: 'two'" in err['error'] and 'usage: depthbench-nb train' in err['error']


# ------------------------------------------------------------------- a sweep whose driver is killed twice
def test_a_sweep_whose_driver_is_killed_twice_finishes_every_run_once(tiny_data, tmp_path):
    """Kill 1: the driver and its child, mid-run. Kill 2: the driver alone (its child trains on, orphaned). The next
    driver leaves the orphan's run alone (busy while it trains: one writer) and the last one finds every run complete
    (exit 0). Each run's metrics equal its uninterrupted record."""
    runs = tmp_path / 'runs'
    env = dict(os.environ, DEPTHBENCH_RUNS=str(runs), OMP_NUM_THREADS='1')
    study = tmp_path / 'k.yaml'
    study.write_text(yaml.safe_dump(dict(name='killed', preset='tiny', data=str(tiny_data), groups=[
        dict(name='g', archs=['preln'], depths=[2], lrs=[1e-3, 2e-3], max_steps=8)])))
    os.environ['DEPTHBENCH_RUNS'] = str(runs)
    try:
        from depthbench_nb.sweep import expand_study, load_study
        entries = expand_study(load_study(study))
    finally: del os.environ['DEPTHBENCH_RUNS']
    folders = [runs / 'killed' / e.run_id for e in entries]
    driver = CLI + ['sweep', 'run', str(study), '--executor', 'python', '--no-progress']
    def start(): return subprocess.Popen(driver, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def wait_rows(folder, n, proc):
        deadline = time.time() + 300
        while len(read_metrics(folder)) < n and time.time() < deadline and proc.poll() is None: time.sleep(0.01)
        assert len(read_metrics(folder)) >= n, 'the run never got going'
    d1 = start(); wait_rows(folders[0], 2, d1)
    os.killpg(d1.pid, signal.SIGKILL); d1.wait()                        # kill 1: the driver and its child
    d2 = start(); wait_rows(folders[1], 2, d2)
    orphan = lock_holder(folders[1])
    os.kill(d2.pid, signal.SIGKILL); d2.wait()                          # kill 2: the driver only; its child trains on
    d3 = subprocess.run(driver + ['--json'], env=env, capture_output=True, text=True, timeout=600)
    third = {o['run_id']: o['action'] for o in json.loads(d3.stdout)['outcomes']}
    assert third[entries[1].run_id] in ('busy', 'skipped'), third      # never a second writer of the orphan's run
    deadline = time.time() + 300
    while lock_holder(folders[1]) is not None and time.time() < deadline: time.sleep(0.05)
    d4 = subprocess.run(driver + ['--json'], env=env, capture_output=True, text=True, timeout=600)
    final = json.loads(d4.stdout)
    assert d4.returncode == 0 and final['status']['completed'] == 2 and final['not_done'] == [], final
    lost = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('DEPTHBENCH_RUNS', str(tmp_path / 'reference'))
        for e, folder in zip(entries, folders):
            train(e.run, progress=False)
            want = read_metrics(run_dir(e.run))
            lost += lost_records(read_metrics(folder), want)
            assert deterministic(read_metrics(folder)) == deterministic(want), e.run_id
    assert orphan > 0 and lost == 0
    ledger(faults=2, runs=2, survived=2, lost=lost)


def test_a_killed_holder_not_yet_reaped_holds_nothing():
    "A lock holder killed but not yet reaped (a zombie: its parent died, init reaps it later) is dead, not busy."
    import socket
    from depthbench_nb.runs import _process_start, holder_alive
    child = subprocess.Popen(['sleep', '60'])
    record = dict(host=socket.gethostname(), pid=child.pid, start=_process_start(child.pid))
    assert holder_alive(record) is True
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while Path(f'/proc/{child.pid}/stat').read_text().rsplit(')', 1)[1].split()[0] != 'Z' and time.time() < deadline: time.sleep(0.01)
    assert holder_alive(record) is False          # still in the process table (not reaped yet), holding nothing
    child.wait()
