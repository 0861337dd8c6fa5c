"""The looped report computes the paper's tables the way the paper does, on run records made here at the paper's
grids (arXiv 2604.21106): Table 3's case studies on their runs plus the r = 1 runs of their budgets (HC: 83 runs),
those r = 1 runs shared with `looped-main` by run id, the baseline refit and delta phi, TBPTT without r = 2; Fig. 3
from the per-r laws; scale labels from the runs; the paper's fitting effort by default; bad input.

The records are written with `runs.write_params/write_result` at the `looped` preset's exact shapes and budgets (248
runs of the paper would take GPU-years); their losses come from the paper's law with each variant's phi plus noise.
"""
import json

import numpy as np
import pandas as pd
import pytest

from depthbench_nb import reports, scaling
from depthbench_nb.config import ConfigError
from depthbench_nb.looped import CASE_STUDY_BUDGETS, looped_grid_rows, looped_params
from depthbench_nb.runs import provenance, run_dir, write_params, write_result
from depthbench_nb.sweep import expand_study, load_study
from depthbench_nb.trainer import make_run_config

LAW = dict(E=1.56773, A=28.027, B=915.82, alpha=0.19924, beta=0.36863)      # the project page's fit
PHI = {'baseline': 0.459, 'hc': 0.646, 'tbptt': 0.380}                     # Table 2 and Table 3
RESTARTS = 24


def record(run, loss: float, steps=None):
    "A completed run record; by default it completed every planned step (the trainer's count)."
    folder = run_dir(run); folder.mkdir(parents=True, exist_ok=True)
    write_params(folder, run)
    tokens = run.train.tokens if run.train.max_steps is None else run.train.max_steps * run.train.global_batch * run.train.seq_len
    write_result(folder, dict(status='completed', run_id=run.run_id, study=run.study, arch='looped', n_layer=run.model.n_layer,
                              d_model=run.model.d_model, preset=run.preset, lr=run.train.lr, seed=run.train.seed,
                              steps=steps if steps is not None else tokens // (run.train.seq_len * run.train.global_batch),
                              tokens=tokens, final_val_loss=loss, best_val_loss=loss, wall_time_s=0.0, train_flops=None,
                              params_total=None, params_backbone=None,
                              provenance=dict(provenance(), note='test fixture: loss from the paper law')))


def grid_run(study: str, row: dict):
    opts = dict(truncated_bptt=True) if row['r_bwd'] < row['r'] else dict(injection='hc') if row['injection'] == 'hc' else {}
    return make_run_config('looped', preset='looped', r=row['r'], s=row['s'], C=row['C'], study=study, verbose=False, **opts)


def law_loss(run, phi: float, rng) -> float:
    p = looped_params(run.model)
    n_eff = p.n_once + run.model.recurrence ** phi * p.n_rec
    return float(LAW['E'] + LAW['A'] * n_eff ** -LAW['alpha'] + LAW['B'] * run.train.tokens ** -LAW['beta'] + 0.003 * rng.standard_normal())


@pytest.fixture(scope='module')
def paper_studies(tmp_path_factory):
    "looped-main (116 runs), looped-hc (63) and looped-tbptt (69), as their shipped studies plan them."
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp('paper-runs')
        mp.setenv('DEPTHBENCH_RUNS', str(root))
        rng = np.random.default_rng(0)
        for study, variant in (('looped-main', 'baseline'), ('looped-hc', 'hc'), ('looped-tbptt', 'tbptt')):
            planned = {e.run_id for e in expand_study(load_study(study))}
            for row in looped_grid_rows(variant):
                if row['reused']: continue          # the case studies' r = 1 rows are looped-main's runs
                run = grid_run(study, row)
                assert run.run_id in planned        # exactly the runs the shipped study plans
                record(run, law_loss(run, PHI[variant], rng))
        yield root


def test_case_studies_are_fitted_with_their_r1_anchors(paper_studies, tmp_path):
    rep = reports.build_looped_report('looped-hc', out_dir=tmp_path, restarts=RESTARTS, n_bootstrap=0)
    t3 = pd.read_csv(tmp_path / 'looped_table3_case_studies.csv').set_index('fit')
    assert t3.loc['hc', 'n_points'] == 83 and t3.loc['hc', 'n_r1'] == 20          # 63 HC runs + the r = 1 runs of 4 budgets
    assert t3.loc['baseline_refit', 'n_points'] == 80 and t3.loc['baseline_refit', 'n_r1'] == 20
    assert t3.loc['hc', 'budgets'] == t3.loc['baseline_refit', 'budgets'] == ', '.join(f'{c:.3g}' for c in CASE_STUDY_BUDGETS)
    # the law these records came from: phi 0.646 with HC, 0.459 without; delta phi measured against the refit
    assert abs(t3.loc['hc', 'phi'] - 0.646) < 0.05 and abs(t3.loc['baseline_refit', 'phi'] - 0.459) < 0.05
    assert t3.loc['hc', 'delta_phi'] == pytest.approx(t3.loc['hc', 'phi'] - t3.loc['baseline_refit', 'phi'])
    assert t3.loc['hc', 'paper_phi'] == 0.646 and t3.loc['hc', 'paper_delta_phi'] == pytest.approx(0.646 - 0.453)
    assert (t3.scale == 'paper scale').all() and (t3.provenance == 'real').all()
    # the anchors are looped-main's runs, found by run id: the planned r = 1 rows of the HC grid
    lf = pd.read_csv(tmp_path / 'looped_runs.csv')
    anchors = reports.case_study_frame(lf, 'hc')
    anchors = anchors[anchors.r == 1]
    planned = {grid_run('looped-main', row).run_id for row in looped_grid_rows('hc') if row['reused']}
    assert set(anchors.run_id) == planned and set(anchors.study) == {'looped-main'}
    assert not any(e.run.model.recurrence == 1 for e in expand_study(load_study('looped-hc')))   # never trained twice
    assert {'looped_table3_case_studies', 'looped_fig10_case_study_residuals'} <= rep.built()
    index = (tmp_path / 'looped_index.md').read_text()
    assert 'no completed baseline looped runs' in index                       # Tables 1/2 belong to looped-main's report


def test_looped_main_report(paper_studies, tmp_path):
    "looped-main's report: Tables 1, 2, 7, Fig. 3 from the per-r laws, and the case studies of the studies reusing it."
    rep = reports.build_looped_report('looped-main', out_dir=tmp_path, restarts=RESTARTS, n_bootstrap=0)
    t3 = pd.read_csv(tmp_path / 'looped_table3_case_studies.csv').set_index('fit')
    assert t3.loc['tbptt', 'n_points'] == 89 and t3.loc['tbptt_without_r2', 'n_points'] == 66 and t3.loc['hc', 'n_points'] == 83
    assert (t3.n_r1 == 20).all()                                               # every case-study fit has its r = 1 anchors
    assert t3.loc['tbptt_without_r2', 'recurrences'] == '1, 4, 8' and abs(t3.loc['tbptt', 'phi'] - 0.38) < 0.06
    t2 = pd.read_csv(tmp_path / 'looped_table2_joint.csv').set_index('fit')
    assert t2.loc['phi_free', 'n_points'] == 116 and abs(t2.loc['phi_free', 'phi'] - 0.459) < 0.03
    t7 = pd.read_csv(tmp_path / 'looped_table7_residuals.csv')
    assert list(t7.r) == ['1', '2', '4', '8', 'all'] and (t7.rmse < 0.006).all() and t7.paper_rmse.notna().all()
    # Fig. 3 comes from the per-r laws: the exponents are those of each r's own fit, not of the joint law
    lf = pd.read_csv(tmp_path / 'looped_runs.csv')
    base = lf[(lf.study == 'looped-main')]
    per_r = scaling.fit_per_r(base.assign(provenance='real'), restarts=RESTARTS)
    mine = reports.frontier_exponents(reports.per_r_frontier(per_r, base), reports.reference_table('looped')).set_index('r')
    shown = pd.read_csv(tmp_path / 'looped_frontier_exponents.csv').set_index('r')
    assert np.allclose(shown.a_N_star, mine.a_N_star, rtol=1e-6) and np.allclose(shown.b_D_star, mine.b_D_star, rtol=1e-6)
    joint = scaling.fit_frame(base.assign(provenance='real'), 'looped', restarts=RESTARTS)
    via_joint = reports.frontier_exponents(reports.per_r_frontier({r: joint for r in per_r}, base), reports.reference_table('looped'))
    assert not np.allclose(via_joint.set_index('r').b_D_star, shown.b_D_star, atol=1e-3)
    assert ((shown.a_N_star + shown.b_D_star) > 1.0).all() and shown.paper_b_D_star.tolist() == [0.53, 0.42, 0.37, 0.44]
    fr = pd.read_csv(tmp_path / 'looped_frontier.csv')
    assert fr.C.min() == pytest.approx(4.64e17) and fr.C.max() == pytest.approx(2.15e19) and not fr.extrapolated.any()
    assert {'looped_table1_per_r', 'looped_fig8_joint_residuals', 'looped_fig9_per_r_residuals', 'looped_frontier',
            'looped_stability'} <= rep.built()
    assert rep.scale.n_runs == 248 and rep.scale.n_comparable == 248 and 'all 248 completed runs are paper scale' in rep.scale.label


def test_scale_comes_from_the_runs(tmp_path, monkeypatch):
    "A looped-preset run capped at 20 steps, or stopped early, is not paper scale; the table says what differs."
    monkeypatch.setenv('DEPTHBENCH_RUNS', str(tmp_path / 'runs'))
    full = make_run_config('looped', preset='looped', r=4, s=10, C=1e18, study='scales', verbose=False)
    capped = make_run_config('looped', preset='looped', r=4, s=12, C=1e18, study='scales', max_steps=20, verbose=False)
    short = make_run_config('looped', preset='looped', r=2, s=10, C=1e18, study='scales', verbose=False)
    record(full, 2.8); record(capped, 3.1); record(short, 2.9, steps=100)
    lf = reports.looped_frame(reports.study_table('scales')).set_index('run_id')
    assert lf.loc[full.run_id, 'scale'] == 'paper scale' and lf.loc[full.run_id, 'paper_scale']
    assert lf.loc[capped.run_id, 'scale'].startswith('reduced scale: planned tokens') and '20 steps completed' in lf.loc[capped.run_id, 'scale']
    assert lf.loc[short.run_id, 'scale'] == 'reduced scale: 100 steps completed (the paper: 3,677)'
    rep = reports.build_looped_report('scales', out_dir=tmp_path / 'report', restarts=2, n_bootstrap=0)
    assert rep.scale.n_comparable == 1 and '1 of 3 completed runs are paper scale' in rep.scale.label


def test_case_study_without_r1_runs_is_a_clear_error(paper_studies, tmp_path):
    lf = reports.looped_frame(pd.concat([reports.study_table('looped-hc')]))   # the HC runs alone, without looped-main
    with pytest.raises(ConfigError, match=r'no r = 1 runs at its budgets C = 4\.64e\+17, 1e\+18, 2\.15e\+18, 4\.64e\+18'):
        reports.case_study_frame(lf, 'hc')
    reports.build_looped_report('looped-hc', out_dir=tmp_path, restarts=2, n_bootstrap=0, related=[])
    index = (tmp_path / 'looped_index.md').read_text()
    assert 'case study hc (Table 3)' in index and 'no r = 1 runs at its budgets' in index and 'looped-main' in index


def test_fit_on_the_box_edge_is_said_in_words():
    "Runs that do not identify the law (phi on the box's edge): Table 2 says so instead of printing an interval."
    syn = scaling.synthetic_looped_frame(dict(scaling.PAPER_LOOPED, phi=3.5), noise=0.0, seed=0)
    joint = scaling.fit_frame(syn, 'looped', restarts=4)
    scaling.attach_bootstrap(joint, scaling.block_bootstrap(syn, 'looped', n_resamples=3, restarts=2, warm_start=joint, workers=1))
    t2 = reports.table2_rows({'phi_free': (joint, syn)}, reports.reference_table('looped')).set_index('fit')
    assert not t2.loc['phi_free', 'identified'] and 'do not identify the law' in t2.loc['phi_free', 'note']
    assert t2.loc['phi_free', 'phi_ci'].startswith('these 116 runs do not identify') and np.isnan(t2.loc['phi_free', 'phi_ci_low'])
    assert t2.loc['phi_free', 'bootstrap_resamples'] == 3 and t2.loc['phi_free', 'best_from_warm_start'] >= 0
    good = scaling.fit_frame(scaling.synthetic_looped_frame(seed=1), 'looped', restarts=8)
    scaling.attach_bootstrap(good, scaling.block_bootstrap(scaling.synthetic_looped_frame(seed=1), 'looped', n_resamples=4, restarts=4,
                                                           warm_start=good, workers=1))
    t2 = reports.table2_rows({'phi_free': (good, syn)}, reports.reference_table('looped')).set_index('fit')
    lo, hi = good.ci['phi']
    assert t2.loc['phi_free', 'phi_ci'] == f'[{lo:.3f}, {hi:.3f}]' and t2.loc['phi_free', 'note'] == ''


def test_report_command_defaults_to_the_papers_effort(runs_dir, monkeypatch, capsys):
    (runs_dir / 'some-study' / 'report').mkdir(parents=True)
    seen = {}
    monkeypatch.setattr(reports, 'run_report_notebooks', lambda study, which, params, progress: seen.update(params) or [])
    assert reports.cli_report(['some-study', '--only', 'looped', '--json']) == 1   # no completed run: nothing reported
    assert seen == dict(restarts=500, n_bootstrap=200, bootstrap_restarts=500, seed=0, workers=None)
    json.loads(capsys.readouterr().out)
    with pytest.raises(ConfigError, match='--bootstrap'):
        reports.cli_report(['some-study', '--bootstrap', '1'])
