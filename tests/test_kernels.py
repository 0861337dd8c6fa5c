"""Kernels: the torch references (gradcheck in float64, closed forms) and the public API's input checks.

The Triton kernels themselves are tested in the interpreter by tests/test_kernels_interpret.py, which runs
in a subprocess with TRITON_INTERPRET=1 set before triton and depthbench_nb.kernels are imported.
"""

import pytest
import torch

from depthbench_nb.config import ConfigError
from depthbench_nb import kernels as K
from kernel_harness import interpreter_report


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _rand(*shape, seed=0, dtype=torch.float64, requires_grad=True):
    return torch.randn(*shape, generator=_g(seed), dtype=dtype).requires_grad_(requires_grad)


def test_gradcheck_rms_norm():
    x, w, r = _rand(3, 5, seed=1), _rand(5, seed=2), _rand(3, 5, seed=3)
    assert torch.autograd.gradcheck(lambda x, w: K._rms_norm_ref(x, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x, w, r: K._rms_norm_ref(x, w, 1e-6, residual=r), (x, w, r))


def test_gradcheck_activations():
    g, u = _rand(4, 3, seed=1), _rand(4, 3, seed=2)
    assert torch.autograd.gradcheck(K._swiglu_ref, (g, u))
    x = (torch.rand(7, generator=_g(3), dtype=torch.float64) + 0.1) * torch.tensor(
        [1, -1, 1, -1, 1, -1, 1.0], dtype=torch.float64
    )
    assert torch.autograd.gradcheck(K._relu_squared_ref, (x.requires_grad_(),))  # away from the kink at 0


def test_gradcheck_sinkhorn():
    assert torch.autograd.gradcheck(lambda z: K._sinkhorn_ref(z, n_iter=5), (_rand(2, 4, 4, seed=4),))


def test_gradcheck_hc():
    s, rw = _rand(2, 3, 4, 5, seed=1), _rand(2, 3, 4, seed=2)
    assert torch.autograd.gradcheck(K._hc_read_ref, (s, rw))
    m, ww, b = _rand(2, 3, 4, 4, seed=3), _rand(2, 3, 4, seed=4), _rand(2, 3, 5, seed=5)
    assert torch.autograd.gradcheck(K._hc_write_ref, (s, m, ww, b))


def test_gradcheck_attnres():
    src, q, wk, wo, bias = (
        _rand(3, 2, 2, 5, seed=1),
        _rand(5, seed=2),
        _rand(5, seed=3),
        _rand(5, seed=4),
        _rand(3, seed=5),
    )

    def f(src, q, wk, wo, bias):
        return K._attnres_mix_ref(src, q, wk, wo, 1e-5, bias=bias, scale=0.7, return_all=True)

    assert torch.autograd.gradcheck(f, (src, q, wk, wo, bias))


def test_sinkhorn_matches_naive_loop_and_gap8():
    z = torch.randn(5, 3, 3, generator=_g(7), dtype=torch.float64)
    # an independent element-wise implementation of the Liger ordering
    out = []
    for zb in z.tolist():
        m = [[v for v in row] for row in zb]
        for i in range(3):
            mx = max(m[i])
            e = [pow(2.718281828459045, v - mx) for v in m[i]]
            s = sum(e)
            m[i] = [v / s + 1e-6 for v in e]

        def cols(m):
            cs = [sum(m[i][j] for i in range(3)) + 1e-6 for j in range(3)]
            return [[m[i][j] / cs[j] for j in range(3)] for i in range(3)]

        def rows(m):
            return [[v / (sum(row) + 1e-6) for v in row] for row in m]

        m = cols(m)
        for _ in range(6):
            m = cols(rows(m))
        out.append(m)
    assert torch.allclose(K._sinkhorn_ref(z, n_iter=7), torch.tensor(out, dtype=torch.float64), atol=1e-10)
    gap8 = torch.full((4, 4), -8.0, dtype=torch.float64).fill_diagonal_(0)
    P = K._sinkhorn_ref(gap8)
    assert abs(P[1, 1].item() - 0.998995) < 1e-5 and abs(P[2, 3].item() - 0.000335) < 2e-6


def test_public_api_bad_input():
    x = torch.randn(2, 4)
    with pytest.raises(TypeError, match="floating"):
        K.rms_norm(torch.ones(2, 4, dtype=torch.long), None, 1e-6)
    with pytest.raises(ValueError, match="eps"):
        K.rms_norm(x, None, -1.0)
    with pytest.raises(ValueError, match="residual must have shape"):
        K.rms_norm(x, None, 1e-6, residual=torch.randn(4))
    with pytest.raises(TypeError, match="floating"):
        K.rms_norm(x, None, 1e-6, residual=x.int())
    with pytest.raises(ValueError, match="one device"):
        K.swiglu(x, torch.randn(2, 4, device="meta"))
    with pytest.raises(ValueError, match="up must have shape"):
        K.swiglu(x, torch.randn(4, 2))
    with pytest.raises(ValueError, match="n_iter"):
        K.sinkhorn(torch.zeros(4, 4), n_iter=0)
    with pytest.raises(ValueError, match="mix must end in"):
        K.hc_write(torch.randn(3, 4, 8), torch.eye(3), torch.ones(4), torch.randn(3, 8))
    with pytest.raises(ValueError, match="branch must have shape"):
        K.hc_write(torch.randn(3, 4, 8), torch.eye(4), torch.ones(4), torch.randn(8))
    with pytest.raises(ValueError, match="query must have shape"):
        K.attnres_mix(torch.randn(2, 1, 3, 8), torch.zeros(7), torch.ones(8), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="one shape"):
        K.attnres_mix([torch.randn(3, 8), torch.randn(2, 8)], torch.zeros(8), torch.ones(8), torch.ones(8), 1e-5)


def test_backend_env(monkeypatch):
    monkeypatch.setenv(K._KERNELS_ENV, "gpu")
    with pytest.raises(ConfigError, match="auto, triton, torch"):
        K.rms_norm(torch.randn(2, 3), None, 1e-6)
    monkeypatch.setenv(K._KERNELS_ENV, "torch")
    x = torch.randn(2, 3)
    assert torch.equal(K.rms_norm(x, None, 1e-6), K._rms_norm_ref(x, None, 1e-6))


# ---------------------------------------------------------------------------------------------------
# The real Triton kernels in the CPU interpreter (fp32 only: the interpreter does no bf16 arithmetic).
# One subprocess (TRITON_INTERPRET=1 must be set before triton/kernels are imported) runs every case.

INTERP_CASES = {
    # every kernel at its default odd sizes (d = 37, 15 tokens)
    **{f"{k}-default": dict(kernel=k) for k in K._KERNEL_NAMES},
    # RMSNorm: no residual, no gain; residual where only y or only h carries gradient; wide rows
    "rms_norm-plain": dict(kernel="rms_norm", example=dict(residual=False, d=130, tokens=9)),
    "rms_norm-only-y": dict(kernel="rms_norm", outputs=[0]),
    "rms_norm-only-h": dict(kernel="rms_norm", outputs=[1]),
    "rms_norm-d1": dict(kernel="rms_norm", example=dict(d=1, tokens=4)),
    # element-wise: several programs (> 1024 elements) with a ragged tail
    "swiglu-multi": dict(kernel="swiglu", example=dict(tokens=40, d=53)),
    "relu_squared-multi": dict(kernel="relu_squared", example=dict(tokens=40, d=53)),
    # Sinkhorn: n not a power of two (padded, masked), one round, several matrices per program
    "sinkhorn-n3": dict(kernel="sinkhorn", example=dict(n=3, n_iter=7, tokens=11)),
    "sinkhorn-n5": dict(kernel="sinkhorn", example=dict(n=5, n_iter=20, tokens=6)),
    "sinkhorn-1round": dict(kernel="sinkhorn", example=dict(n_iter=1)),
    # HC: n = 3 streams, d larger than one d-chunk (256 at n = 4)
    "hc_read-n3-d300": dict(kernel="hc_read", example=dict(n=3, d=300, tokens=6)),
    "hc_write-n3-d300": dict(kernel="hc_write", example=dict(n=3, d=300, tokens=6)),
    "hc_write-n4-d600": dict(kernel="hc_write", example=dict(n=4, d=600, tokens=3)),
    # AttnRes: one source; many sources and d over one chunk; no bias; only p / only raw carry gradient
    "attnres-S1": dict(kernel="attnres_mix", example=dict(S=1)),
    "attnres-S9-d600": dict(kernel="attnres_mix", example=dict(S=9, d=600, tokens=3, bias=False)),
    "attnres-only-out": dict(kernel="attnres_mix", outputs=[0]),
    "attnres-only-raw": dict(kernel="attnres_mix", outputs=[1]),
    "attnres-only-p": dict(kernel="attnres_mix", outputs=[2]),
    # mixed precision as under autocast: a float16 activation with a float32 one (outputs promote to float32)
    "rms_norm-mixed": dict(kernel="rms_norm", example=dict(dtype="float16", dtype2="float32")),
    "swiglu-mixed": dict(kernel="swiglu", example=dict(dtype="float16", dtype2="float32")),
    "hc_write-mixed": dict(kernel="hc_write", example=dict(dtype="float32", dtype2="float16")),
    # the kernels inside tiny models (depthbench_nb.model): logits and every parameter gradient, kernels vs torch
    **{
        f"model-{name}": dict(model=arch, options=opts)
        for name, arch, opts in [
            ("preln", "preln", {}),
            ("hc", "hc", {}),
            ("mhc", "mhc", {}),
            ("mhc-static", "mhc", dict(mhc_backend="static")),
            ("attnres", "attnres", {}),
            ("block_attnres", "block_attnres", dict(attnres_block_size=2)),
        ]
    },
    # the reference mixing path inside models: the stacked AttnRes kernel (the fused path runs the site kernels)
    "model-attnres-reference": dict(model="attnres", mixing="reference"),
    "model-block_attnres-reference": dict(
        model="block_attnres", options=dict(attnres_block_size=2), mixing="reference"
    ),
    "model-attnres-deep": dict(model="attnres", n_layer=3),
    # the looped model (squared-ReLU MLP, RMSNorms, QK-norm): 2 + 1x2 + 2 layers
    "model-looped": dict(model="looped", n_layer=6, options=dict(recurrence=2)),
    # the fused AttnRes site against its torch twin: a partial sum; none; no stored source;
    # d over one tile, many sources
    "fused-attnres_site": dict(fused="attnres_site"),
    "fused-attnres_site-no-partial": dict(fused="attnres_site", example=dict(partial=False)),
    "fused-attnres_site-n0": dict(fused="attnres_site", example=dict(n=0)),
    "fused-attnres_site-n19-d300": dict(fused="attnres_site", example=dict(n=19, d=300, rows=3)),
}
FP32_RTOL = 1e-5


@pytest.fixture(scope="module")
def interp():
    names = list(INTERP_CASES)
    report = interpreter_report([INTERP_CASES[n] for n in names], timeout=240)
    return dict(zip(names, report))


@pytest.mark.parametrize("case", list(INTERP_CASES))
def test_triton_kernel_matches_reference_in_interpreter(interp, case):
    r = interp[case]
    assert r["dispatched"], "DEPTHBENCH_KERNELS=triton with TRITON_INTERPRET=1 must dispatch to the kernel on CPU"
    errs = r["errors"]
    if "model" in INTERP_CASES[case]:
        assert set(errs) == {"logits", "grads"}, errs
        assert errs["logits"] <= 1e-5 and errs["grads"] <= 1e-4, f"{case}: {errs}"
        return
    if "fused" in INTERP_CASES[case]:  # out, raw, p and the gradient of every input
        assert {"out0", "out1", "out2", "grad0"} <= set(errs) and max(errs.values()) <= FP32_RTOL, f"{case}: {errs}"
        return
    n_out = {"rms_norm": 1, "attnres_mix": 3}.get(INTERP_CASES[case]["kernel"], 1)
    assert sum(k.startswith("out") for k in errs) >= n_out and any(k.startswith("grad") for k in errs)
    # float16 storage: both sides compute in fp32 and round once, so they differ by at most ~1 fp16 ulp
    tol = 2e-3 if "float16" in INTERP_CASES[case].get("example", {}).values() else FP32_RTOL
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"{case}: relative errors above {tol}: {bad}"


@pytest.mark.parametrize("case", [c for c in INTERP_CASES if "kernel" in INTERP_CASES[c]])
def test_interpreter_grids_are_small(case):
    # the interpreter costs about 1 ms per program instance: every kernel case keeps its inputs to a few thousand
    # values, so each launch is a handful of programs (a size bound, not a timing: the machine may be loaded)
    spec = INTERP_CASES[case]
    ex = {k: getattr(torch, v) if k.startswith("dtype") else v for k, v in spec.get("example", {}).items()}
    args, kw = K._kernel_example(spec["kernel"], **ex)
    sizes = [t.numel() for t in (*args, *kw.values()) if isinstance(t, torch.Tensor)]
    assert sizes and max(sizes) <= 16384, f"{case}: an input of {max(sizes)} values makes a large interpreter grid"


def test_compare_to_reference_detects_a_wrong_kernel(monkeypatch):
    # the comparison the self-check relies on must see a 1% error (here a deliberately wrong "kernel")
    monkeypatch.setitem(K._TRITON_IMPLS, "relu_squared", lambda x: K._relu_squared_ref(x) * 1.01)
    args, kw = K._kernel_example("relu_squared")
    errs = K._compare_to_reference("relu_squared", args, kw)
    assert errs["out0"] == pytest.approx(0.01, rel=1e-3) and errs["grad0"] == pytest.approx(0.01, rel=1e-3)


def test_self_check_falls_back_with_warning_or_raises(monkeypatch):
    monkeypatch.setitem(K._TRITON_IMPLS, "swiglu", lambda g, u: K._swiglu_ref(g, u) + 1e-2)
    monkeypatch.setattr(K, "_SELF_CHECKS", {})
    with pytest.warns(RuntimeWarning, match="'swiglu' failed its self-check"):
        assert K._self_check("swiglu", torch.device("cpu"), strict=False) is False
    assert K._SELF_CHECKS[("swiglu", "cpu")] is False  # checked once, remembered
    with pytest.raises(RuntimeError, match="failed its self-check"):
        K._self_check("swiglu", torch.device("cpu"), strict=True)
    monkeypatch.setitem(K._TRITON_IMPLS, "swiglu", lambda g, u: K._swiglu_ref(g, u))
    monkeypatch.setattr(K, "_SELF_CHECKS", {})
    assert K._self_check("swiglu", torch.device("cpu"), strict=True) is True


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "autocast"])
def test_self_check_is_independent_of_the_callers_context(monkeypatch, context):
    # the first CUDA call of a kernel may happen inside eval (no_grad / inference_mode) or under bf16 autocast
    # (where the references' einsums would run in bf16): the check must still compare fp32 with gradients
    # a stand-in "kernel": the same sum written element-wise, which autocast leaves in fp32
    def elementwise_hc_write(s, m, w, b):
        return (m[..., :, :, None] * s[..., None, :, :]).sum(-2) + w[..., :, None] * b[..., None, :]

    monkeypatch.setitem(K._TRITON_IMPLS, "hc_write", elementwise_hc_write)
    monkeypatch.setattr(K, "_SELF_CHECKS", {})
    ctx = {
        "no_grad": torch.no_grad(),
        "inference_mode": torch.inference_mode(),
        "autocast": torch.autocast("cpu", dtype=torch.bfloat16),
    }[context]
    with ctx:
        assert K._self_check_error("hc_write", torch.device("cpu")) is None


def test_forced_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    if K._TRITON_INTERPRETED:
        pytest.fail("this test process must not run the interpreter")
    monkeypatch.setenv(K._KERNELS_ENV, "triton")
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        K.swiglu(torch.randn(3), torch.randn(3))
    # fp64 (gradcheck) always goes to the reference, even when Triton is forced
    x = torch.randn(3, dtype=torch.float64)
    assert torch.equal(K.relu_squared(x), K._relu_squared_ref(x))
    monkeypatch.setenv(K._KERNELS_ENV, "auto")
    assert torch.equal(K.relu_squared(x.float()), K._relu_squared_ref(x.float()))  # auto on CPU: the reference


def test_mixed_precision_promotes_like_torch():
    x16, x32 = torch.randn(2, 3, 8).bfloat16(), torch.randn(2, 3, 8)
    y, h = K.rms_norm(x16, torch.ones(8), 1e-6, residual=x32)
    assert y.dtype == h.dtype == torch.float32 and torch.equal(h, x16 + x32)
    assert K.swiglu(x16, x32).dtype == torch.float32
    H = torch.randn(2, 3, 4, 8)
    out = K.hc_write(H, torch.eye(4), torch.ones(4), x16)
    assert out.dtype == torch.float32 and torch.equal(out, H + x16.float()[..., None, :])
    assert K.attnres_mix([x32, x16], torch.zeros(8), torch.ones(8), torch.ones(8), 1e-5).dtype == torch.float32


def test_gpu_benchmark_refuses_without_cuda():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels_gpu.py"
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "no CUDA GPU" in p.stderr and "nothing measured" in p.stderr


def test_forced_triton_without_triton_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(K, "HAS_TRITON", False)
    monkeypatch.setenv(K._KERNELS_ENV, "triton")
    with pytest.raises(ConfigError, match="triton is not installed"):
        K.relu_squared(torch.randn(3))
    monkeypatch.setenv(K._KERNELS_ENV, "auto")
    x = torch.randn(3)
    assert torch.equal(K.relu_squared(x), K._relu_squared_ref(x))


def test_attnres_list_path_equals_the_stacked_reference():
    "The model passes its sources as a list; the torch path mixes them without stacking: same values and gradients."
    from depthbench_nb.kernels import attnres_mix, _attnres_mix_ref

    g = torch.Generator().manual_seed(0)
    srcs = [torch.randn(2, 5, 7, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(6)]
    q, kw, ow = (torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(6, dtype=torch.float64, generator=g)
    outs = attnres_mix(srcs, q, kw, ow, 1e-5, bias=bias, scale=0.5, return_all=True)
    refs = _attnres_mix_ref(torch.stack(srcs), q, kw, ow, 1e-5, bias=bias, scale=0.5, return_all=True)
    for a, b in zip(outs, refs):
        assert torch.allclose(a, b, atol=1e-12)
    params = [*srcs, q, kw, ow]
    ga = torch.autograd.grad(outs[0].square().sum() + outs[1].sum(), params)
    gb = torch.autograd.grad(refs[0].square().sum() + refs[1].sum(), params)
    for a, b in zip(ga, gb):
        assert torch.allclose(a, b, atol=1e-10)
