"""Kernels: the torch references (gradcheck in float64, closed forms) and the public API's input checks.

The Triton kernels themselves are tested in the interpreter by tests/test_kernels_interpret.py, which runs
in a subprocess with TRITON_INTERPRET=1 set before triton and depthbench_nb.kernels are imported.
"""
import pytest
import torch

from depthbench_nb.config import ConfigError
from depthbench_nb import kernels as K


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _rand(*shape, seed=0, dtype=torch.float64, requires_grad=True):
    return torch.randn(*shape, generator=_g(seed), dtype=dtype).requires_grad_(requires_grad)


def test_gradcheck_rms_norm():
    x, w, r = _rand(3, 5, seed=1), _rand(5, seed=2), _rand(3, 5, seed=3)
    assert torch.autograd.gradcheck(lambda x, w: K.rms_norm_ref(x, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x, w, r: K.rms_norm_ref(x, w, 1e-6, residual=r), (x, w, r))


def test_gradcheck_activations():
    g, u = _rand(4, 3, seed=1), _rand(4, 3, seed=2)
    assert torch.autograd.gradcheck(K.swiglu_ref, (g, u))
    x = (torch.rand(7, generator=_g(3), dtype=torch.float64) + 0.1) * torch.tensor([1, -1, 1, -1, 1, -1, 1.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(K.relu_squared_ref, (x.requires_grad_(),))   # away from the kink at 0


def test_gradcheck_sinkhorn():
    assert torch.autograd.gradcheck(lambda z: K.sinkhorn_ref(z, n_iter=5), (_rand(2, 4, 4, seed=4),))


def test_gradcheck_hc():
    s, rw = _rand(2, 3, 4, 5, seed=1), _rand(2, 3, 4, seed=2)
    assert torch.autograd.gradcheck(K.hc_read_ref, (s, rw))
    m, ww, b = _rand(2, 3, 4, 4, seed=3), _rand(2, 3, 4, seed=4), _rand(2, 3, 5, seed=5)
    assert torch.autograd.gradcheck(K.hc_write_ref, (s, m, ww, b))


def test_gradcheck_attnres():
    src, q, wk, wo, bias = _rand(3, 2, 2, 5, seed=1), _rand(5, seed=2), _rand(5, seed=3), _rand(5, seed=4), _rand(3, seed=5)
    f = lambda src, q, wk, wo, bias: K.attnres_mix_ref(src, q, wk, wo, 1e-5, bias=bias, scale=0.7, return_all=True)
    assert torch.autograd.gradcheck(f, (src, q, wk, wo, bias))


def test_sinkhorn_matches_naive_loop_and_gap8():
    z = torch.randn(5, 3, 3, generator=_g(7), dtype=torch.float64)
    # an independent element-wise implementation of the Liger ordering
    out = []
    for zb in z.tolist():
        m = [[v for v in row] for row in zb]
        for i in range(3):
            mx = max(m[i]); e = [pow(2.718281828459045, v - mx) for v in m[i]]; s = sum(e)
            m[i] = [v / s + 1e-6 for v in e]
        def cols(m):
            cs = [sum(m[i][j] for i in range(3)) + 1e-6 for j in range(3)]
            return [[m[i][j] / cs[j] for j in range(3)] for i in range(3)]
        def rows(m):
            return [[v / (sum(row) + 1e-6) for v in row] for row in m]
        m = cols(m)
        for _ in range(6): m = cols(rows(m))
        out.append(m)
    assert torch.allclose(K.sinkhorn_ref(z, n_iter=7), torch.tensor(out, dtype=torch.float64), atol=1e-10)
    gap8 = torch.full((4, 4), -8.0, dtype=torch.float64).fill_diagonal_(0)
    P = K.sinkhorn_ref(gap8)
    assert abs(P[1, 1].item() - 0.998995) < 1e-5 and abs(P[2, 3].item() - 0.000335) < 2e-6


def test_public_api_bad_input():
    x = torch.randn(2, 4)
    with pytest.raises(TypeError, match='floating'): K.rms_norm(torch.ones(2, 4, dtype=torch.long), None, 1e-6)
    with pytest.raises(ValueError, match='eps'): K.rms_norm(x, None, -1.0)
    with pytest.raises(ValueError, match='residual must have shape'): K.rms_norm(x, None, 1e-6, residual=torch.randn(4))
    with pytest.raises(TypeError, match='one dtype'): K.rms_norm(x, None, 1e-6, residual=x.half())
    with pytest.raises(ValueError, match='up must have shape'): K.swiglu(x, torch.randn(4, 2))
    with pytest.raises(ValueError, match='n_iter'): K.sinkhorn(torch.zeros(4, 4), n_iter=0)
    with pytest.raises(ValueError, match='mix must end in'): K.hc_write(torch.randn(3, 4, 8), torch.eye(3), torch.ones(4), torch.randn(3, 8))
    with pytest.raises(ValueError, match='branch must have shape'): K.hc_write(torch.randn(3, 4, 8), torch.eye(4), torch.ones(4), torch.randn(8))
    with pytest.raises(ValueError, match='query must have shape'): K.attnres_mix(torch.randn(2, 1, 3, 8), torch.zeros(7), torch.ones(8), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match='one shape'): K.attnres_mix([torch.randn(3, 8), torch.randn(2, 8)], torch.zeros(8), torch.ones(8), torch.ones(8), 1e-5)


def test_backend_env(monkeypatch):
    monkeypatch.setenv(K.KERNELS_ENV, 'gpu')
    with pytest.raises(ConfigError, match='auto, triton, torch'): K.rms_norm(torch.randn(2, 3), None, 1e-6)
    monkeypatch.setenv(K.KERNELS_ENV, 'torch')
    x = torch.randn(2, 3)
    assert torch.equal(K.rms_norm(x, None, 1e-6), K.rms_norm_ref(x, None, 1e-6))
