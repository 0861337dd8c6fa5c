"""Benchmark of the scaling-law fitter (issue 10) against a naive scipy loop, in one run.

Data: the looped paper's 116-run grid with losses generated from the project-page law plus 0.005 nats of
Gaussian noise (provenance 'synthetic': a check of the fitter, not a reproduction of phi).

  ours : depthbench_nb.scaling: L-BFGS-B per start, analytic gradient (jac=True), kernel vectorised over runs,
         tight tolerances (ftol = gtol = 1e-15, maxiter 10000), the full `--restarts` fit and a
         `--resamples`-resample block bootstrap with `--boot-restarts` random starts + 1 warm start per refit.
  naive: scipy.optimize.minimize(L-BFGS-B) per start with numeric (2-point) gradients of an objective written
         with scipy.special.huber and logsumexp, the same tight tolerances and the same box.
         It is timed on a SUBSAMPLE (`--naive-restarts` starts of the full fit, `--naive-resamples` bootstrap
         refits) and EXTRAPOLATED linearly to the full counts; its objective is the best of its subsample
         (it can only go down with more starts, so the objective comparison is reported as measured).

Times are CPU seconds of this process (time.process_time, one thread): on a shared machine wall-clock time
measures the neighbours; CPU time measures the work.

Run:  OMP_NUM_THREADS=1 python benchmarks/bench_fit.py            (about 3-6 minutes on one core)
      OMP_NUM_THREADS=1 python benchmarks/bench_fit.py --quick    (fewer resamples, about 1 minute)
"""
import argparse
import json
import os
import time
from functools import partial

os.environ.setdefault('OMP_NUM_THREADS', '1')

import numpy as np
from scipy.optimize import minimize

from depthbench_nb.scaling import (LOWER, SCIPY_OPTIONS, UPPER, block_bootstrap, fit_frame, law_data_from_frame,
                                   naive_objective, synthetic_looped_frame)


def naive_fit(data, restarts, seed):
    "The naive loop: numeric gradients, scipy's huber/logsumexp objective, tight tolerances, same box."
    rng = np.random.default_rng(seed)
    best = None
    for x0 in LOWER + (UPPER - LOWER) * rng.random((restarts, 6)):
        r = minimize(naive_objective, x0, args=(data,), method='L-BFGS-B', bounds=list(zip(LOWER, UPPER)),
                     options=SCIPY_OPTIONS)
        if best is None or r.fun < best.fun: best = r
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--restarts', type=int, default=500)
    p.add_argument('--resamples', type=int, default=200)
    p.add_argument('--boot-restarts', type=int, default=200)
    p.add_argument('--naive-restarts', type=int, default=50)
    p.add_argument('--naive-resamples', type=int, default=2)
    p.add_argument('--quick', action='store_true', help='20 resamples (the bootstrap time is then extrapolated too)')
    p.add_argument('--json', default=None, help='also write the numbers to this JSON file')
    a = p.parse_args()
    resamples_run = 20 if a.quick else a.resamples

    df = synthetic_looped_frame(noise=0.005, seed=0)
    data = law_data_from_frame(df, 'looped')
    out = dict(n_runs=len(df), provenance='synthetic', restarts=a.restarts, resamples=a.resamples,
               boot_restarts=a.boot_restarts)

    t = time.process_time(); fit = fit_frame(df, 'looped', restarts=a.restarts, seed=0); ours_fit_s = time.process_time() - t
    t = time.process_time()
    boot = block_bootstrap(partial(fit_frame, law='looped', restarts=a.boot_restarts), df, ('C', 'r'),
                           n_resamples=resamples_run, seed=0, warm_start=fit)
    ours_boot_s = (time.process_time() - t) * a.resamples / resamples_run
    out.update(ours_fit_s=ours_fit_s, ours_fit_J=fit.huber, ours_phi=fit.phi, ours_boot_s=ours_boot_s,
               ours_boot_measured_resamples=resamples_run, ours_phi_ci=boot['ci']['phi'])

    t = time.process_time(); nv = naive_fit(data, a.naive_restarts, seed=0); dt = time.process_time() - t
    naive_fit_s = dt * a.restarts / a.naive_restarts
    t = time.process_time()
    blocks = list(df.groupby(['C', 'r']).indices.values())
    rng = np.random.default_rng(0)
    for i in range(a.naive_resamples):           # the same block resampling, refit by the naive loop
        frame = df.iloc[np.concatenate([blocks[j] for j in rng.integers(0, len(blocks), len(blocks))])]
        naive_fit(law_data_from_frame(frame, 'looped'), a.naive_restarts, seed=i + 1)
    dtb = time.process_time() - t
    naive_boot_s = dtb / a.naive_resamples * a.resamples * (a.boot_restarts + 1) / a.naive_restarts
    out.update(naive_fit_s_extrapolated=naive_fit_s, naive_fit_measured_restarts=a.naive_restarts, naive_fit_J=float(nv.fun),
               naive_phi=float(nv.x[5]), naive_boot_s_extrapolated=naive_boot_s,
               naive_boot_measured=f'{a.naive_resamples} resamples x {a.naive_restarts} starts',
               speedup_fit=naive_fit_s / ours_fit_s, speedup_boot=naive_boot_s / ours_boot_s,
               J_ours_minus_naive=fit.huber - float(nv.fun))

    print(f"data: {len(df)} synthetic runs (paper grid, project-page law + 0.005 nats noise)")
    print(f"full fit, {a.restarts} restarts : ours {ours_fit_s:8.2f} CPU s  J = {fit.huber:.6e}  phi = {fit.phi:.4f}")
    print(f"                        naive {naive_fit_s:8.2f} CPU s  J = {nv.fun:.6e}  phi = {nv.x[5]:.4f}"
          f"   (timed on {a.naive_restarts} starts, x{a.restarts / a.naive_restarts:g} extrapolated; J best of those)")
    print(f"   speed-up {naive_fit_s / ours_fit_s:.1f}x, J(ours) - J(naive) = {fit.huber - nv.fun:+.3e}")
    print(f"bootstrap, {a.resamples} resamples x ({a.boot_restarts} + 1 warm) starts:")
    print(f"                        ours {ours_boot_s:8.2f} CPU s" + ('' if resamples_run == a.resamples else
          f"  (measured on {resamples_run} resamples, extrapolated)") + f"  phi 95% CI {np.round(boot['ci']['phi'], 3).tolist()}")
    print(f"                        naive {naive_boot_s:8.2f} CPU s  (timed on {a.naive_resamples} resamples x {a.naive_restarts} starts, extrapolated)")
    print(f"   speed-up {naive_boot_s / ours_boot_s:.1f}x")
    if a.json:
        with open(a.json, 'w') as f: json.dump(out, f, indent=2, default=float)


if __name__ == '__main__':
    main()
