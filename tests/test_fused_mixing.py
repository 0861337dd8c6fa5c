"""The fused depth-mixing paths (AttnRes sources, MoDA depth keys and values, HC/mHC streams) against the reference
ops they replace: logits and every gradient, for every design of the registry at several depths; the autograd of the
preallocated state stores (skips, states, a second backward); the mixing bytes of `costs` against a count of the
bytes the mixing reads and writes in a traced step."""

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from depthbench_nb import kernels as K
from depthbench_nb import model as M
from depthbench_nb.config import ConfigError, ModelConfig, recipe_designs
from depthbench_nb.costs import mixing_bytes_per_token
from depthbench_nb.model import build_model

DESIGNS = recipe_designs()  # the designs on DepthBench's backbone and recipe
VARIANTS = [
    ("hc", dict(hc_update="unmixed")),
    ("mhc", dict(mhc_backend="native")),
    ("mhc", dict(mhc_backend="static")),
    ("block_attnres", dict(attnres_block_size=2)),
    ("block_attnres", dict(attnres_num_blocks=3)),
    ("moda", dict(moda_ffn_kv=False)),
    ("moda", dict(n_kv_head=4)),  # one group: the slots' gradients are summed by their writes (deferred)
    ("moda", dict(n_kv_head=4, moda_ffn_kv=False)),
]


def config(arch: str, L: int, **options) -> ModelConfig:
    "4 heads over 2 KV heads (GQA), d 32: small enough for CI, every code path of the fused ops."
    shape = dict(n_kv_head=2) | options  # an option may set n_kv_head = 4 (one query head per KV head)
    return ModelConfig(arch=arch, n_layer=L, d_model=32, n_head=4, vocab_size=64, max_seq_len=32, **shape)


def trained_like(cfg: ModelConfig, dtype=torch.float32, scale: float = 0.1) -> M.DepthModel:
    "The design's init moved off its symmetric start (zero AttnRes queries, zero HC projections): non-uniform mixes."
    model = build_model(cfg, seed=0).to(dtype)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("_mix.", "_hc.", "depth_kv")):
                p.add_(scale * torch.randn(p.shape, generator=g).to(dtype))
    return model


def logits_and_grads(model, idx, mixing: str, **kw):
    "Logits (or the loss's inputs) and the gradient of every parameter, on one mixing path."
    model = copy.deepcopy(model)
    model.mixing = mixing
    model.zero_grad(set_to_none=True)
    out = model(idx[:, :-1], **kw)
    logits, states = out if isinstance(out, tuple) else (out, [])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten()) + sum(s.square().mean() for s in states)
    loss.backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def assert_same(model, idx, rtol: float, **kw):
    (lr, gr), (lf, gf) = logits_and_grads(model, idx, "reference", **kw), logits_and_grads(model, idx, "fused", **kw)
    assert set(gr) == set(gf), set(gr) ^ set(gf)
    assert rel(lf, lr) <= rtol, f"logits differ by {rel(lf, lr):.2e}"
    scale = max(g.abs().max().item() for g in gr.values())  # gradients relative to the largest one
    worst = max(gr, key=lambda n: (gf[n] - gr[n]).abs().max().item())
    err = (gf[worst] - gr[worst]).abs().max().item() / scale
    assert err <= rtol, f"gradient of {worst} differs by {err:.2e} (relative to the largest gradient)"


IDX = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("L", [1, 2, 5])
@pytest.mark.parametrize("arch", DESIGNS)
def test_fused_path_equals_the_reference_fp32(arch, L):
    "Forward and gradients of the fused path within 1e-6 of the reference ops (fp32), every design, several depths."
    assert_same(trained_like(config(arch, L)), IDX, 1e-6)


@pytest.mark.parametrize(
    "arch,options", VARIANTS, ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items())
)
def test_fused_path_equals_the_reference_for_option_variants(arch, options):
    assert_same(trained_like(config(arch, 4, **options)), IDX, 1e-6)


@pytest.mark.parametrize("arch", ["hc", "mhc", "attnres", "moda"])
def test_fused_path_is_as_accurate_as_the_reference_far_from_init(arch):
    """Moved far from init (HC's dynamic gains ~30x theirs) fp32 rounding itself reaches a few 1e-6 of the gradients:
    there the fused path's error against an fp64 reference stays within that of the reference ops."""
    m32, m64 = trained_like(config(arch, 5), scale=0.3), trained_like(config(arch, 5), torch.float64, scale=0.3)
    _, exact = logits_and_grads(m64, IDX, "reference")
    scale = max(g.abs().max().item() for g in exact.values())

    def err(grads):
        return max((grads[n].double() - exact[n]).abs().max().item() for n in exact) / scale

    reference, fused = err(logits_and_grads(m32, IDX, "reference")[1]), err(logits_and_grads(m32, IDX, "fused")[1])
    # fp32 rounding of one step is a few 1e-6 of the largest gradient, and where in that range the reference falls
    # depends on the CPU's summation order (AVX2 or AVX-512): within twice the reference's error, or within 1e-5 (about
    # 80 fp32 ulps); a wrong gradient is off by far more, and the fp64 test below checks the math to 1e-12
    assert fused <= max(2 * reference, 1e-5), f"fused {fused:.1e} vs reference {reference:.1e} (relative to fp64)"


@pytest.mark.parametrize("arch", ["attnres", "block_attnres", "moda", "hc", "mhc"])
def test_fused_path_is_the_same_math_in_fp64(arch):
    """In fp64 the two paths agree to rounding (1e-12): the fused ops compute the reference's function, not an
    approximation."""
    assert_same(trained_like(config(arch, 4), torch.float64), IDX, 1e-12)


@pytest.mark.parametrize("arch", ["attnres", "block_attnres", "moda", "moda-mha", "hc", "mhc"])
def test_fused_path_with_skips_and_states(arch):
    """A skipped block (the store's first reader after a write may never reach the loss) and a loss on the depth states
    too: the stores' gradients still reach every source."""
    options = {"block_attnres": dict(attnres_num_blocks=4), "moda-mha": dict(n_kv_head=4)}.get(arch, {})
    model = trained_like(config(arch.removesuffix("-mha"), 5, **options))
    assert_same(model, IDX, 1e-6, skip=[1], return_states=True)
    assert_same(model, IDX, 1e-6, skip=[0, 3], return_states=True)


@pytest.mark.parametrize("arch,options", [("attnres", {}), ("moda", {}), ("moda", dict(n_kv_head=4))])
def test_a_second_backward_through_the_stores_sums_like_the_reference(arch, options):
    """retain_graph and a second backward: the slot gradients are summed afresh, not carried over (the store clears
    them)."""
    model = trained_like(config(arch, 3, **options))
    grads = {}
    for mixing in ("reference", "fused"):
        m = copy.deepcopy(model)
        m.mixing = mixing
        loss = F.cross_entropy(m(IDX[:, :-1]).flatten(0, 1), IDX[:, 1:].flatten())
        loss.backward(retain_graph=True)
        loss.backward()
        grads[mixing] = {n: p.grad for n, p in m.named_parameters()}
    for n, g in grads["reference"].items():
        torch.testing.assert_close(grads["fused"][n], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("arch", ["attnres", "block_attnres", "moda"])
def test_a_training_step_leaves_no_store_behind(arch):
    """The stores die with their step's tensors, by reference counting alone: none is left for the garbage collector,
    which cannot see a cycle through autograd's nodes (a leak of every step's stores, tens of MiB a step at L = 32)."""
    model = trained_like(config(arch, 3))
    model.mixing = "fused"
    gc.disable()
    try:
        for _ in range(2):
            F.cross_entropy(model(IDX[:, :-1]).flatten(0, 1), IDX[:, 1:].flatten()).backward()
        alive = [o for o in gc.get_objects() if isinstance(o, K.DepthStore)]
    finally:
        gc.enable()
    assert alive == []


def test_mixing_path_is_chosen_by_the_model_the_environment_or_compile(monkeypatch):
    monkeypatch.delenv(K._MIXING_ENV, raising=False)
    assert K.mixing_path() == "fused" and K.mixing_path("reference") == "reference"
    monkeypatch.setenv(K._MIXING_ENV, "reference")
    assert K.mixing_path() == "reference" and K.mixing_path("fused") == "fused"  # a model's own choice wins
    monkeypatch.setenv(K._MIXING_ENV, "fast")
    with pytest.raises(ConfigError, match="fused, reference"):
        K.mixing_path()
    monkeypatch.setattr(K, "_compiling", lambda: True)
    assert K.mixing_path("fused") == "reference"  # torch.compile traces the reference


# ---------------------------------------------------------------------------------------------------------------
# the mixing bytes of the cost model against a traced step


class StateTraffic(TorchDispatchMode):
    """Counts, per window (one mixing call), the distinct bytes of watched storages the ops read (inputs) and write
    (mutated arguments), plus the bytes of tensors a window declares as state it writes (a returned gradient)."""

    def __init__(self):
        super().__init__()
        self.watched: dict[int, int] = {}  # storage data_ptr -> element size
        self.window = None  # (reads, writes): sets of (storage, element offset)
        self.total = 0

    def watch(self, *tensors):
        for t in tensors:
            if t is not None:
                self.watched[t.untyped_storage().data_ptr()] = t.element_size()

    def _elements(self, t: torch.Tensor) -> set:
        base = t.untyped_storage().data_ptr()
        n = t.untyped_storage().nbytes() // t.element_size()
        idx = torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset())
        return {(base, int(i)) for i in idx.flatten().unique()}

    def open(self):
        self.window = (set(), set())

    def close(self, written=()):
        reads, writes = self.window
        for t in written:
            self.total += t.numel() * t.element_size()
        self.total += sum(self.watched[b] for b, _ in reads) + sum(self.watched[b] for b, _ in writes)
        self.window = None
        self.watched.clear()  # a freed storage's address may come back as another tensor's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.window is not None and not func.is_view:  # a view (slice, select, ...) moves no data
            schema = func._schema.arguments
            flat = list(args) + [kwargs.get(a.name) for a in schema[len(args) :]]
            for a, v in zip(schema, flat):
                if not isinstance(v, torch.Tensor) or v.untyped_storage().data_ptr() not in self.watched:
                    continue
                self.window[0].update(self._elements(v))
                if a.alias_info is not None and a.alias_info.is_write:
                    self.window[1].update(self._elements(v))
        return func(*args, **kwargs)


def wrap(monkeypatch, cls, mode: StateTraffic, watch_fwd, watch_bwd, written_bwd=lambda ctx, grads: ()):
    "Open a counting window around a Function's forward and backward, watching the state tensors each touches."
    fwd, bwd = cls.forward, cls.backward

    def forward(ctx, *args):
        mode.watch(*watch_fwd(*args))
        mode.open()
        try:
            return fwd(ctx, *args)
        finally:
            mode.close()

    def backward(ctx, *grads):
        mode.watch(*watch_bwd(ctx))
        mode.open()
        out = bwd(ctx, *grads)
        mode.close(written_bwd(ctx, out))
        return out

    monkeypatch.setattr(cls, "forward", staticmethod(forward))
    monkeypatch.setattr(cls, "backward", staticmethod(backward))


def traced_step(model, idx) -> None:
    model.mixing = "fused"
    F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()


@pytest.mark.parametrize(
    "arch,options",
    [
        ("attnres", {}),
        ("block_attnres", {}),
        ("block_attnres", dict(attnres_block_size=3)),
        ("moda", {}),
        ("moda", dict(moda_ffn_kv=False)),
        ("moda", dict(n_kv_head=4)),
        ("moda", dict(n_kv_head=4, moda_ffn_kv=False)),
    ],
)
def test_mixing_bytes_of_the_stores_match_a_traced_step(arch, options, monkeypatch):
    """Forward + backward bytes of AttnRes sources / MoDA depth slots touched per mixing call, summed over a step (MoDA
    with one group: plus the readers' terms each slot's write reads to sum its gradient, and that gradient)."""
    cfg = config(arch, 4, **options)
    mode, grouped = StateTraffic(), cfg.n_kv_head != cfg.n_head

    def grads(st):
        return (st.values, st.grad_buffer())

    if arch == "moda":
        wrap(
            monkeypatch,
            K._MoDAAttentionFn,
            mode,
            lambda q, k, v, keys, values, *_: (keys.values, values.values),
            lambda ctx: grads(ctx.keys) + grads(ctx.values) if grouped else (ctx.keys.values, ctx.values.values),
        )
        if not grouped:  # the slots' writes sum their gradients from the readers' terms
            wrap(
                monkeypatch,
                K._WriteSlot,
                mode,
                lambda *_: (),
                lambda ctx: [t for _, weights, y in ctx.store.outers for t in (weights[0], y)],  # views of one tensor
                lambda ctx, out: [out[2]] if out[2] is not None else [],
            )
    else:
        wrap(
            monkeypatch,
            K._AttnResSiteFn,
            mode,
            lambda store, n, q, kw, wo, partial, *_: (store.values, partial),
            lambda ctx: grads(ctx.store) + (ctx.saved_tensors[3] if ctx.has_partial else None,),
            lambda ctx, out: [out[5]] if out[5] is not None else [],
        )
    idx = IDX[:1]
    with mode:
        traced_step(trained_like(cfg), idx)
    forward, backward = mixing_bytes_per_token(cfg, bytes_per_elem=4)
    assert mode.total == (forward + backward) * (idx.shape[1] - 1)


@pytest.mark.parametrize("arch", ["hc", "mhc"])
def test_mixing_bytes_of_the_streams_match_a_traced_forward(arch, monkeypatch):
    "HC/mHC: every sublayer reads its n streams and writes them mixed (the forward half of the closed form)."
    cfg = config(arch, 3)
    mode, sublayer = StateTraffic(), M.MultiStreamBlock._sublayer

    def counted(H, connector, branch, ctx):
        mode.watch(H)
        mode.open()
        out = sublayer(H, connector, branch, ctx)
        mode.close([out])
        return out

    monkeypatch.setattr(M.MultiStreamBlock, "_sublayer", staticmethod(counted))
    model, idx = trained_like(cfg), IDX[:1]
    model.mixing = "fused"
    with mode, torch.no_grad():
        model(idx)
    # the first sublayer's streams are one embedding expanded n times: n x d logical elements, d distinct ones
    expanded = (cfg.hc_streams - 1) * cfg.d_model * 4 * idx.shape[1]
    assert mode.total + expanded == mixing_bytes_per_token(cfg, 4)[0] * idx.shape[1]
