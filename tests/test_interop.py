"""Interop: OLMo-core logits parity, DepthBench/OLMo-core checkpoint import (every design, the fork's names),
safetensors save/load, LlamaForCausalLM export, and KV-cache greedy generation (cache == no cache)."""

import json
import re
import logging
import math
import time

import pytest
import torch

from depthbench_nb.config import ConfigError, ModelConfig
from depthbench_nb.interop import (
    llama_exportable,
    _canonical_fork_state_dict,
    _check_fork_layout,
    cli_import_checkpoint,
    decode_throughput,
    detect_arch,
    export_llama,
    _fork_layout,
    generate,
    import_checkpoint,
    infer_model_config,
    load_pretrained,
    _model_from_fork_state_dict,
    name_map,
    _ours_to_fork,
    _read_dcp_state_dict,
    read_state_dict,
    save_pretrained,
)
from depthbench_nb.model import build_model
from depthbench_nb.shapes import count_params
from depthbench_nb.runs import load_run

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

TINY = dict(n_layer=2, d_model=32, n_head=4, n_kv_head=2, vocab_size=64, max_seq_len=64)
DESIGNS = {  # every DepthBench design (and backend) the importer maps
    "preln": {},
    "periln": {},
    "lns": {},
    "deepnorm": {},
    "keel": {},
    "hc": {},
    "hc_unmixed": dict(hc_update="unmixed"),
    "mhc": {},
    "mhc_native": dict(mhc_backend="native"),
    "mhc_static": dict(mhc_backend="static"),
    "attnres": {},
    "block_attnres": dict(attnres_block_size=2),
    "moda": {},
    "moda_nokv": dict(moda_ffn_kv=False),
}


def tiny(name: str, **kw) -> ModelConfig:
    arch = name.split("_")[0] if name not in ("block_attnres",) else name
    return ModelConfig(arch=arch, **(TINY | DESIGNS.get(name, {}) | kw))


def random_fork_sd(cfg: ModelConfig, seed: int = 0, scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(s, generator=g) for k, s in _fork_layout(cfg).items()}


def refusal(fn, *args, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kw)
    return str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# 1. Parity with OLMo-core (ai2-olmo-core, test-only dependency) for the block types it shares with us
# ---------------------------------------------------------------------------------------------------------------
OLMO_BLOCKS = {"preln": "default", "periln": "peri_norm", "lns": "default_scaled"}


def olmo_core_model(cfg: ModelConfig, seed: int = 0, fix_ln_scale: bool = True):
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer import TransformerConfig

    logging.getLogger("olmo_core").setLevel(logging.ERROR)
    oc = TransformerConfig.llama_like(
        d_model=cfg.d_model,
        vocab_size=cfg.vocab_size,
        n_layers=cfg.n_layer,
        n_heads=cfg.n_head,
        n_kv_heads=cfg.n_kv_head,
        rope_theta=int(cfg.rope_theta),
        layer_norm_eps=cfg.norm_eps,
        block_name=OLMO_BLOCKS[cfg.arch],
        feed_forward=FeedForwardConfig(hidden_size=cfg.ffn_hidden, bias=False),
    )
    model = oc.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    if (
        cfg.arch == "lns" and fix_ln_scale
    ):  # to_empty() in init_weights leaves this buffer uninitialized (OLMo-core PR #698)
        for b, blk in model.blocks.items():
            blk.ln_scale.fill_(1 / math.sqrt(int(b) + 1))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # move every weight (norm gains included) away from init so a misplaced tensor shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("arch", list(OLMO_BLOCKS))
def test_olmo_core_parity_through_importer(arch, tmp_path, runs_dir, capsys):
    """OLMo-core writes its DCP checkpoint; the CLI imports it; the run folder's model gives OLMo-core's logits (fp32,
    1e-5)."""
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    cfg = tiny(arch, n_layer=3)
    oc = olmo_core_model(cfg)
    save_model_and_optim_state(str(tmp_path / "ckpt" / "step7" / "model_and_optim"), oc)
    rc = cli_import_checkpoint(
        [str(tmp_path / "ckpt" / "step7"), "--arch", arch, "--L", "3", "--n-head", "4", "--max-seq-len", "64", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["source_format"] == "dcp" and out["arch"] == arch
    model, run = load_run(out["run_dir"])
    assert run.model == cfg
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, got = oc(idx), model(idx)
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    result = json.loads((runs_dir / "imported" / run.run_id / "result.json").read_text())
    assert result["provenance"]["origin"] == "imported" and result["steps"] == 7 and result["status"] == "completed"
    assert result["params_total"] == count_params(cfg).total


def test_olmo_core_state_dict_names_are_the_fork_layout():
    """The fork layout of the shared blocks is exactly upstream OLMo-core's state dict (names and shapes), LNS buffer
    aside."""
    for arch in OLMO_BLOCKS:
        cfg = tiny(arch)
        sd = olmo_core_model(cfg).state_dict()
        assert {k: tuple(v.shape) for k, v in _canonical_fork_state_dict(sd).items()} == _fork_layout(cfg)


def test_olmo_core_lns_with_wrong_ln_scale_is_refused(tmp_path, runs_dir):
    "An LNS checkpoint whose ln_scale buffer is not 1/sqrt(b+1) (what to_empty() does to upstream's buffer) is refused."
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    oc = olmo_core_model(tiny("lns"))
    oc.blocks["1"].ln_scale.fill_(0.0)
    save_model_and_optim_state(str(tmp_path / "lns" / "model_and_optim"), oc)
    assert "blocks.1.ln_scale" in refusal(import_checkpoint, str(tmp_path / "lns"), "lns", n_head=4)


def test_plain_torch_dcp_is_read(tmp_path):
    "A checkpoint written by torch's own DCP writer (not OLMo-core's) reads back exactly, optimizer state ignored."
    import torch.distributed.checkpoint as dcp

    sd = random_fork_sd(tiny("preln"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"model": {k: v.clone() for k, v in sd.items()}, "optim": {"step": torch.tensor(3.0)}},
            checkpoint_id=str(tmp_path / "dcp"),
        )
    got = _read_dcp_state_dict(tmp_path / "dcp")
    assert got.keys() == sd.keys() and all(torch.equal(got[k], sd[k]) for k in sd)


# ---------------------------------------------------------------------------------------------------------------
# 2. Importer: the fork's names and layouts for every design
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(DESIGNS))
def test_fork_layout_round_trip(name):
    "Fork-named tensors -> our model -> fork names is the identity; every parameter of ours is covered."
    cfg = tiny(name)
    sd = random_fork_sd(cfg)
    model = _model_from_fork_state_dict(sd, cfg)
    back = _ours_to_fork(model)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    mapped = {r.ours for r in name_map(cfg)}
    extra = {n for n, _ in model.named_parameters()} - mapped
    assert extra == set()  # AttnRes too: neither side has a block-0 attention mixer


@pytest.mark.parametrize("name", list(DESIGNS))
def test_fork_layout_counts_match_closed_form(name):
    """Parameter count of the fork layout = shapes.count_params, every design (AttnRes: 4Ld mixer parameters on both
    sides)."""
    cfg = tiny(name, n_layer=3)
    fork = sum(math.prod(s) for s in _fork_layout(cfg).values())
    assert fork == count_params(cfg).total


def _set_fork_init(sd: dict, cfg: ModelConfig) -> dict:
    "The fork's own connector/mixer init values (hyper_connections.py reset_parameters, reset_attnres_parameters)."
    n = cfg.hc_streams
    for k in list(sd):
        if k.endswith("static_alpha"):
            site_k = 2 * int(k.split(".")[1]) + (k.split(".")[2].startswith("feed_forward"))
            a = torch.zeros(n, n + 1)
            a[site_k % n, 0] = 1
            a[:, 1:] = torch.eye(n)
            sd[k] = a
        elif k.endswith(("dynamic_alpha_proj", "dynamic_beta_proj")) or k.endswith("res_proj.weight"):
            sd[k] = torch.zeros_like(sd[k])
        elif k.endswith(("dynamic_alpha_scale", "dynamic_beta_scale")):
            sd[k] = torch.tensor(0.01)
        elif k.endswith("static_beta"):
            sd[k] = torch.ones(n)
    return sd


def _preln_twin(sd: dict, cfg: ModelConfig):
    "Pre-LN model holding the same core weights (the fork's Pre-LN names are a subset of every design's)."
    pre = ModelConfig(arch="preln", **{k: getattr(cfg, k) for k in TINY})
    return _model_from_fork_state_dict({k: sd[k] for k in _fork_layout(pre)}, pre)


@pytest.mark.parametrize("update", ["mixed", "unmixed"])
def test_imported_hc_at_fork_init_is_n_times_preln(update):
    """HC at the fork's init is Pre-LN on n equal streams; the sum readout gives n x the Pre-LN logits (official
    nn/hyper_connections.py)."""
    cfg = tiny("hc", hc_update=update)
    sd = _set_fork_init(random_fork_sd(cfg, seed=3, scale=0.5), cfg)
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        hc, pre = _model_from_fork_state_dict(sd, cfg)(idx), _preln_twin(sd, cfg)(idx)
    assert torch.allclose(hc, cfg.hc_streams * pre, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["attnres", "block_attnres"])
def test_imported_attnres_with_zero_queries_is_preln(name):
    """Zero pseudo-queries mix uniformly; RMSNorm of the mean = RMSNorm of the Pre-LN sum (up to eps) (official
    AttnResTransformerBlock)."""
    cfg = tiny(name)
    sd = _set_fork_init(random_fork_sd(cfg, seed=4), cfg)  # unit-scale weights: eps (1e-5 vs 1e-6) is negligible
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        ar, pre = _model_from_fork_state_dict(sd, cfg)(idx), _preln_twin(sd, cfg)(idx)
    assert ((ar - pre).abs().max() / pre.abs().max()).item() < 1e-3


def test_fork_checkpoint_with_aliases_and_prefixes_imports(tmp_path, runs_dir):
    "A fork mHC .pt state dict (DDP 'module.' prefix, connector branch aliases) imports; options are inferred."
    cfg = tiny("mhc_native")
    sd = random_fork_sd(cfg, seed=6)
    raw = {"module." + k: v for k, v in sd.items()}
    for b in range(cfg.n_layer):
        raw[f"module.blocks.{b}.feed_forward_hyper_connection.branch.norm.weight"] = sd[
            f"blocks.{b}.feed_forward_norm.weight"
        ]
        raw[f"module.blocks.{b}.attention_hyper_connection.branch.attention.w_k.weight"] = sd[
            f"blocks.{b}.attention.w_k.weight"
        ]
    torch.save(raw, tmp_path / "mhc-lr1e-3.pt")
    folder, result = import_checkpoint(str(tmp_path / "mhc-lr1e-3.pt"), "mhc", n_head=4, max_seq_len=64)
    model, run = load_run(folder)
    assert run.model == cfg and run.train.lr == 1e-3 and result["provenance"]["source_format"] == "torch"
    idx = torch.randint(0, 64, (1, 8))
    assert torch.equal(model(idx), _model_from_fork_state_dict(sd, cfg)(idx))


def test_mismatches_are_refused_naming_the_first_tensor(tmp_path, runs_dir):
    cfg = tiny("hc")
    sd = random_fork_sd(cfg)
    torch.save(sd, tmp_path / "hc.pt")
    e = refusal(import_checkpoint, str(tmp_path / "hc.pt"), "mhc", n_head=4)  # wrong design
    assert "first mismatching tensor" in e and "look like arch 'hc'" in e
    assert "blocks.2.attention.w_q.weight is missing" in refusal(
        import_checkpoint, str(tmp_path / "hc.pt"), "hc", n_layer=3, n_head=4
    )
    bad = dict(sd)
    bad["blocks.1.feed_forward.w2.weight"] = torch.zeros(32, 7)
    assert "blocks.1.feed_forward.w2.weight has shape [32, 7], expected [32, 96]" in refusal(
        _check_fork_layout, bad, cfg
    )
    alias = dict(sd)
    alias["blocks.0.attention_hyper_connection.branch.norm.weight"] = torch.zeros(32)
    assert "should alias blocks.0.attention_norm.weight" in refusal(_canonical_fork_state_dict, alias)
    assert "option" in refusal(
        cli_import_checkpoint, [str(tmp_path / "hc.pt"), "--arch", "hc", "--option", "hc_update"]
    )


def test_detect_arch_and_infer_config():
    for name in ("preln", "periln", "keel", "hc", "mhc", "mhc_static", "attnres", "moda"):
        cfg = tiny(name)
        sd = random_fork_sd(cfg)
        assert detect_arch(sd) == cfg.arch
        assert infer_model_config(cfg.arch, sd, n_head=4, max_seq_len=64) == cfg


def test_hub_id_offline_fails_fast(monkeypatch, runs_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refusal(import_checkpoint, "someone/warm-up-imports", "preln")
    t0 = time.time()
    e = refusal(import_checkpoint, "someone/preln-lr2e-3-llama-400M-L24", "preln")
    assert time.time() - t0 < 5 and "offline" in e and "hf download someone/preln-lr2e-3-llama-400M-L24" in e


def test_missing_local_path_is_a_clean_error():
    with pytest.raises(FileNotFoundError):
        import_checkpoint("/nonexistent/ckpt", "preln")


# ---------------------------------------------------------------------------------------------------------------
# 3. Save / load (safetensors + config JSON) and the LlamaForCausalLM export
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["preln", "keel", "hc", "mhc_static", "block_attnres", "moda"])
def test_save_load_pretrained(name, tmp_path):
    cfg = tiny(name)
    model = build_model(cfg, seed=7).eval()
    loaded = load_pretrained(save_pretrained(model, tmp_path / name))
    idx = torch.randint(0, 64, (2, 9))
    assert loaded.config == cfg and torch.equal(loaded(idx), model(idx))


def test_load_pretrained_refuses_a_file_that_does_not_fit(tmp_path):
    save_pretrained(build_model(tiny("preln")), tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "config.json").read_text())
    meta["model"]["d_model"] = 64
    (tmp_path / "a" / "config.json").write_text(json.dumps(meta))
    assert "first mismatching tensor tok_emb.weight has shape [64, 32], expected [64, 64]" in refusal(
        load_pretrained, tmp_path / "a"
    )


@pytest.mark.parametrize("arch", llama_exportable())
def test_export_llama_logits_parity(arch, tmp_path):
    from transformers import LlamaForCausalLM

    cfg = tiny(arch, n_layer=3)
    model = build_model(cfg, seed=8).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    hf = LlamaForCausalLM.from_pretrained(export_llama(model, tmp_path / "hf"), torch_dtype=torch.float32).eval()
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ((ours - theirs).abs().max() / ours.abs().max()).item() <= 1e-5
    back, fmt = read_state_dict(tmp_path / "hf")  # Hugging Face LLaMA names import back
    if arch == "preln":
        assert torch.equal(_model_from_fork_state_dict(_canonical_fork_state_dict(back), cfg)(idx), ours)


def test_export_refuses_other_designs(tmp_path):
    assert "LlamaForCausalLM" in refusal(export_llama, build_model(tiny("hc")), tmp_path / "x")


# ---------------------------------------------------------------------------------------------------------------
# 4. Greedy generation with a KV cache
# ---------------------------------------------------------------------------------------------------------------
GEN_DESIGNS = list(DESIGNS) + ["looped"]


@pytest.mark.parametrize("name", GEN_DESIGNS)
def test_generate_cache_equals_no_cache(name):
    cfg = (
        ModelConfig(arch="looped", n_layer=20, d_model=32, n_head=4, vocab_size=64, max_seq_len=64, recurrence=4)
        if name == "looped"
        else tiny(name, n_layer=3)
    )
    model = build_model(cfg, seed=9)
    prompt = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    with_cache, without = generate(model, prompt, 10, use_cache=True), generate(model, prompt, 10, use_cache=False)
    assert with_cache.shape == (2, 16) and torch.equal(with_cache[:, :6], prompt)
    assert torch.equal(with_cache, without)


def test_generate_checks_its_input():
    model = build_model(tiny("preln"))
    assert "max_seq_len" in refusal(generate, model, torch.zeros(1, 60, dtype=torch.long), 10)
    assert "max_new_tokens" in refusal(generate, model, torch.zeros(1, 3, dtype=torch.long), -1)
    eos_stop = generate(
        model,
        torch.zeros(1, 3, dtype=torch.long),
        5,
        eos_id=int(generate(model, torch.zeros(1, 3, dtype=torch.long), 1)[0, -1]),
    )
    assert eos_stop.shape == (1, 4)


def test_decode_throughput_reports_cache_size():
    cfg = tiny("preln")
    t = decode_throughput(build_model(cfg), batch_size=2, prompt_len=8, new_tokens=4)
    kv = cfg.n_kv_head * cfg.head_dim
    assert t["decode_tokens_per_s"] > 0 and t["prefill_tokens_per_s"] > 0
    assert t["kv_cache_bytes"] == cfg.n_layer * 2 * 2 * (8 + 4) * kv * 4  # layers x (K, V) x B x T x width x fp32


def test_diagnose_runs_on_an_imported_checkpoint(tmp_path, runs_dir, capsys):
    "An imported fork checkpoint is an ordinary run folder: `depthbench-nb diagnose` reads it and writes its tables."
    from depthbench_nb.config import DataConfig
    from depthbench_nb.data import prepare
    from depthbench_nb.hf_diagnostics import cli_diagnose  # the diagnose command (run folders and Transformers models)

    prepare(DataConfig(), progress=False)  # the package's default offline data (bpe:4096)
    cfg = tiny("attnres", vocab_size=4096, n_layer=3)
    torch.save(random_fork_sd(cfg, seed=11, scale=0.1), tmp_path / "attnres.pt")
    assert (
        cli_import_checkpoint(
            [
                str(tmp_path / "attnres.pt"),
                "--arch",
                "attnres",
                "--n-head",
                "4",
                "--max-seq-len",
                "64",
                "--data-source",
                "sample",
                "--tokenizer",
                "bpe:4096",
                "--json",
            ]
        )
        == 0
    )
    folder = json.loads(capsys.readouterr().out)["run_dir"]
    assert (
        cli_diagnose(
            [folder, "--metrics", "angular,causal,permutation", "--n-samples", "2", "--seq-len", "16", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    full = json.loads(
        (tmp_path / "runs" / "imported" / folder.split("/")[-1] / "diagnostics" / "diagnostics.json").read_text()
    )
    assert len(full["angular"]["matrix"]) == cfg.n_layer + 1 and "files" in out


# ---------------------------------------------------------------------------------------------------------------
# The fork's forward, restated from its equations and applied to fork-named tensors directly (no name map, none of
# our modules): an independent reference for the designs upstream OLMo-core lacks. Files: nn/hyper_connections.py
# (HC both update rules, native and static mHC), the official Liger mHC kernel, block.py AttnResTransformerBlock and
# model.py final mix, nn/moda.py (MoDA). Backbone pieces (RoPE, RMSNorm, SwiGLU) are the ones OLMo-core parity pins.
# ---------------------------------------------------------------------------------------------------------------
import torch.nn.functional as F  # noqa: E402

from depthbench_nb.kernels import sinkhorn as liger_sinkhorn  # noqa: E402  (the op the Liger kernel defines)
from depthbench_nb.layers import apply_rope, rope_angles  # noqa: E402


def _rms(x, w=None, eps=1e-6):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _fork_qkv(sd, p, x, cfg):
    B, T, _ = x.shape
    hd = cfg.head_dim
    q = (x @ sd[p + "w_q.weight"].T).view(B, T, cfg.n_head, hd)
    k = (x @ sd[p + "w_k.weight"].T).view(B, T, cfg.n_kv_head, hd)
    v = (x @ sd[p + "w_v.weight"].T).view(B, T, cfg.n_kv_head, hd)
    return q, k, v


def _fork_attention(sd, p, x, cfg):
    B, T, _ = x.shape
    q, k, v = _fork_qkv(sd, p, x, cfg)
    cos, sin = rope_angles(cfg.head_dim, torch.arange(T), cfg.rope_theta)
    q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=cfg.n_head != cfg.n_kv_head)
    return y.transpose(1, 2).reshape(B, T, -1) @ sd[p + "w_out.weight"].T


def _fork_ffn(sd, p, x):
    return (F.silu(x @ sd[p + "w1.weight"].T) * (x @ sd[p + "w3.weight"].T)) @ sd[p + "w2.weight"].T


def _log_sinkhorn(z, iters):  # hyper_connections.sinkhorn_log, tau = 1
    n = z.shape[-1]
    u, v = torch.zeros_like(z[..., 0]), torch.zeros_like(z[..., 0, :])
    for _ in range(iters):
        u = -math.log(n) - torch.logsumexp(z + v.unsqueeze(-2), dim=-1)
        v = -math.log(n) - torch.logsumexp(z + u.unsqueeze(-1), dim=-2)
    return torch.exp(z + u.unsqueeze(-1) + v.unsqueeze(-2)) * n


def _fork_connector(sd, c, H, branch, cfg):
    "One fork connector around `branch`; H [B, T, n, d] -> [B, T, n, d]."
    n, kind = cfg.hc_streams, ("hc" if cfg.arch == "hc" else cfg.mhc_backend)
    if kind == "hc":
        Hn = _rms(H, eps=1e-8)
        alpha = sd[c + "static_alpha"] + sd[c + "dynamic_alpha_scale"] * torch.tanh(Hn @ sd[c + "dynamic_alpha_proj"])
        C = torch.einsum("...st,...sd->...td", alpha, H)  # C_t = sum_s A[s,t] H_s
        out = branch(C[..., 0, :])
        beta = sd[c + "static_beta"] + sd[c + "dynamic_beta_scale"] * torch.tanh(Hn @ sd[c + "dynamic_beta_proj"])
        base = C[..., 1:, :] if cfg.hc_update == "mixed" else H  # @f61f873 mixed, @5152cab unmixed
        return base + beta.unsqueeze(-1) * out.unsqueeze(-2)
    if kind == "liger":  # the official Liger mHC kernel
        x = H.flatten(-2)
        m = (x @ sd[c + "phi"]) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        b = sd[c + "b"]
        pre = torch.sigmoid(sd[c + "alpha_pre"] * m[..., :n] + b[:n])
        post = 2 * torch.sigmoid(sd[c + "alpha_post"] * m[..., n : 2 * n] + b[n : 2 * n])
        res = liger_sinkhorn(
            (sd[c + "alpha_res"] * m[..., 2 * n :] + b[2 * n :]).unflatten(-1, (n, n)), cfg.sinkhorn_iters
        )
        mixed = torch.einsum("...ij,...jd->...id", res, H)  # x'_i = sum_j H_res[i,j] x_j
    elif kind == "native":
        xn = _rms(H.flatten(-2), eps=1e-8)
        pre = torch.sigmoid(sd[c + "pre_gate"] * (xn @ sd[c + "pre_dynamic_proj"]) + sd[c + "pre_bias"])
        post = 2 * torch.sigmoid(sd[c + "post_gate"] * (xn @ sd[c + "post_dynamic_proj"]) + sd[c + "post_bias"])
        res = _log_sinkhorn(
            (sd[c + "residual_gate"] * (xn @ sd[c + "residual_dynamic_proj"])).unflatten(-1, (n, n))
            + sd[c + "residual_bias"],
            cfg.sinkhorn_iters,
        )
        mixed = torch.einsum("...st,...sd->...td", res, H)  # the fork's transpose convention
    else:  # static
        res = _log_sinkhorn(sd[c + "H_res_logits"], cfg.sinkhorn_iters)
        pre, post = torch.softmax(sd[c + "H_pre_logits"], -1), torch.softmax(sd[c + "H_post_logits"], -1)
        mixed = torch.einsum("st,...sd->...td", res, H)
    out = branch(torch.einsum("...s,...sd->...d", pre, H))
    return mixed + post.unsqueeze(-1) * out.unsqueeze(-2)


def _fork_mix(query, key_w, out_w, sources, eps=1e-5):  # kernels/attnres.py fused_attnres
    v = torch.stack(sources)  # [S, B, T, d]
    p = torch.softmax(torch.einsum("sbtd,d->bts", _rms(v, key_w, eps), query.reshape(-1)), dim=-1)
    return _rms(torch.einsum("bts,sbtd->btd", p, v), out_w, eps)


def fork_reference_logits(sd: dict, cfg: ModelConfig, idx: torch.Tensor) -> torch.Tensor:
    "Logits of the fork's model of `cfg` holding the fork-named tensors `sd`."
    eps, L = cfg.norm_eps, cfg.n_layer
    x = sd["embeddings.weight"][idx]  # [B, T, d]
    fam = cfg.family
    if fam == "multistream":
        H = x.unsqueeze(-2).expand(*x.shape[:-1], cfg.hc_streams, x.shape[-1])
        for b in range(L):
            p = f"blocks.{b}."
            H = _fork_connector(
                sd,
                p + "attention_hyper_connection.",
                H,
                lambda u: _fork_attention(sd, p + "attention.", _rms(u, sd[p + "attention_norm.weight"], eps), cfg),
                cfg,
            )
            H = _fork_connector(
                sd,
                p + "feed_forward_hyper_connection.",
                H,
                lambda u: _fork_ffn(sd, p + "feed_forward.", _rms(u, sd[p + "feed_forward_norm.weight"], eps)),
                cfg,
            )
        w = sd["lm_head.norm.weight"]
        mean_collapse = (
            cfg.arch == "mhc" and cfg.mhc_backend == "liger"
        )  # config.py reduce_mode: mean for liger_mhc only
        h = _rms(H.mean(-2), w, eps) if mean_collapse else _rms(H, w, eps).sum(-2)
        return h @ sd["lm_head.w_out.weight"].T
    if fam == "attnres":
        S = 1 if cfg.arch == "attnres" else cfg.attnres_block_size
        states, prefix = None, x
        for b in range(L):
            p = f"blocks.{b}."
            if states is None:
                h_in, states, prefix = _rms(prefix, sd[p + "attention_norm.weight"], eps), [prefix], None
            else:
                residuals = [*states, prefix]
                if (2 * b) % S == 0:
                    states, prefix = residuals, None
                h_in = _fork_mix(
                    sd[p + "attn_res_proj.weight"],
                    sd[p + "attn_res_norm.weight"],
                    sd[p + "attention_norm.weight"],
                    residuals,
                )
            a = _fork_attention(sd, p + "attention.", h_in, cfg)
            prefix = a if prefix is None else prefix + a
            residuals = [*states, prefix]
            if (2 * b + 1) % S == 0:
                states, prefix = residuals, None
            m = _fork_ffn(
                sd,
                p + "feed_forward.",
                _fork_mix(
                    sd[p + "mlp_res_proj.weight"],
                    sd[p + "mlp_res_norm.weight"],
                    sd[p + "feed_forward_norm.weight"],
                    residuals,
                ),
            )
            prefix = m if prefix is None else prefix + m
        h = _fork_mix(sd["res_proj.weight"], sd["res_norm.weight"], sd["lm_head.norm.weight"], [*states, prefix])
        return h @ sd["lm_head.w_out.weight"].T
    assert cfg.arch == "moda"
    B, T, _ = x.shape
    hd, Hk = cfg.head_dim, cfg.n_kv_head
    depth_k, depth_v = [], []  # slot s: [B, T, H_kv, hd]
    cos, sin = rope_angles(hd, torch.arange(T), cfg.rope_theta)
    for b in range(L):
        p, a = f"blocks.{b}.", f"blocks.{b}.attention.attention."
        u = _rms(x, sd[p + "attention_norm.weight"], eps)
        q, k, v = _fork_qkv(sd, a, u, cfg)
        qr, kr = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # depth keys stay un-rotated (cached before RoPE)
        g = cfg.n_head // Hk
        seq = torch.einsum("bqhd,bkhd->bhqk", qr, kr.repeat_interleave(g, 2)) / math.sqrt(hd)
        seq = seq.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        if depth_k:
            dk, dv = (
                torch.stack(depth_k, 2).repeat_interleave(g, 3),
                torch.stack(depth_v, 2).repeat_interleave(g, 3),
            )  # [B,T,S,H,hd]
            dsc = torch.einsum("bthd,btshd->bhts", qr, dk) / math.sqrt(hd)
            pr = torch.softmax(torch.cat([seq, dsc], -1), -1)
            y = pr[..., :T] @ v.repeat_interleave(g, 2).transpose(1, 2) + torch.einsum(
                "bhts,btshd->bhtd", pr[..., T:], dv
            )
        else:
            y = torch.softmax(seq, -1) @ v.repeat_interleave(g, 2).transpose(1, 2)
        h = x + y.transpose(1, 2).reshape(B, T, -1) @ sd[a + "w_out.weight"].T
        depth_k.append(k)
        depth_v.append(v)  # slot 2b
        u = _rms(h, sd[p + "feed_forward_norm.weight"], eps)
        if p + "feed_forward.kv_proj.weight" in sd:  # slot 2b+1: rows K heads then V heads
            kv = (u @ sd[p + "feed_forward.kv_proj.weight"].T).view(B, T, 2, Hk, hd)
            depth_k.append(kv[:, :, 0])
            depth_v.append(kv[:, :, 1])
        else:  # never written: a zero slot, still attended
            depth_k.append(torch.zeros_like(k))
            depth_v.append(torch.zeros_like(v))
        x = h + _fork_ffn(sd, p + "feed_forward.feed_forward.", u)
    return _rms(x, sd["lm_head.norm.weight"], eps) @ sd["lm_head.w_out.weight"].T


FORK_ONLY = ["hc", "hc_unmixed", "mhc", "mhc_native", "mhc_static", "attnres", "block_attnres", "moda", "moda_nokv"]


def _fork_like_weights(cfg, seed):
    "Random fork tensors at trained-model-like scales: routing near the fork's init plus noise, so every term matters."
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, s in _fork_layout(cfg).items():
        t = torch.randn(s, generator=g)
        if k.endswith("norm.weight"):
            t = 1 + 0.2 * t
        elif k.endswith(("_bias", ".b", "_logits")):
            t = 2 * t
        elif k.endswith(("scale", "gate")) or re.search(r"\.alpha_(pre|post|res)$", k):
            t = 0.5 + 0.1 * t
        elif k.endswith("static_alpha"):
            t = torch.eye(*s) + 0.3 * t if s[0] != s[1] else t
        elif k.endswith("static_beta"):
            t = 1 + 0.3 * t
        else:
            t = 0.3 * t
        sd[k] = t
    return sd


@pytest.mark.parametrize("name", FORK_ONLY)
def test_imported_model_matches_the_forks_forward(name, monkeypatch):
    """Fork-named random weights: our imported model == the fork's equations run on the fork's tensors.
    Compared in float64, so the check is exact (HC's unconstrained mixing amplifies fp32 round-off to ~2e-5)."""
    cfg = tiny(name, n_layer=3)
    sd = _fork_like_weights(cfg, seed=12)
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))

    def rel_error():
        with torch.no_grad():
            ref = fork_reference_logits({k: v.double() for k, v in sd.items()}, cfg, idx)
            got = _model_from_fork_state_dict(sd, cfg).double()(idx)
        return ((got - ref).abs().max() / ref.abs().max()).item()

    if name == "mhc_native":  # ours normalizes in fp32 on purpose (the fork's fp32 upcast), even in a float64 model
        assert rel_error() <= 1e-6
    else:
        assert rel_error() <= 1e-10


def test_release_layout_latest_or_requested_step(tmp_path, runs_dir):
    "A run folder with step<N>/ checkpoints (the release layout) imports its latest step, or the one asked for."
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    cfg = tiny("preln")
    models = {s: olmo_core_model(cfg, seed=s) for s in (0, 3000)}
    for s, m in models.items():
        save_model_and_optim_state(str(tmp_path / "run" / f"step{s}" / "model_and_optim"), m)
    idx = torch.randint(0, 64, (1, 8))
    for step, want in ((None, 3000), (0, 0)):
        folder, result = import_checkpoint(str(tmp_path / "run"), "preln", n_head=4, max_seq_len=64, step=step)
        assert result["steps"] == want
        with torch.no_grad():
            assert torch.allclose(load_run(folder)[0](idx), models[want](idx), rtol=1e-5, atol=1e-5)
    assert "available steps: [0, 3000]" in refusal(import_checkpoint, str(tmp_path / "run"), "preln", n_head=4, step=7)


def test_config_json_settles_block_size_and_heads(tmp_path, runs_dir):
    "OLMo-core's config.json next to the checkpoint supplies n_heads and AttnRes's block size S (not in the weights)."
    cfg = tiny("block_attnres", attnres_block_size=2)
    (tmp_path / "ck").mkdir()
    torch.save(random_fork_sd(cfg), tmp_path / "ck" / "model.pt")
    (tmp_path / "ck" / "config.json").write_text(
        json.dumps(
            {
                "model": {
                    "d_model": 32,
                    "block": {"attnres_block_size": 2, "sequence_mixer": {"n_heads": 4, "n_kv_heads": 2}},
                }
            }
        )
    )
    folder, result = import_checkpoint(str(tmp_path / "ck"), "block_attnres", max_seq_len=64)
    assert load_run(folder)[1].model == cfg and result["notes"] == []
    assert "--arch block_attnres" in refusal(import_checkpoint, str(tmp_path / "ck"), "attnres", max_seq_len=64)
    (tmp_path / "ck" / "config.json").unlink()
    _, result = import_checkpoint(str(tmp_path / "ck"), "block_attnres", n_head=4, max_seq_len=64, attnres_block_size=2)
    assert result["notes"] == []


def test_dcp_index_unpickler_refuses_code(tmp_path):
    "The DCP index is a pickle: only checkpoint-metadata classes are accepted, never a callable like os.system."
    import os
    import pickle

    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / ".metadata").write_bytes(pickle.dumps(os.system))
    from depthbench_nb.config import UnsafeFile  # a clear error (kind 'unsafe'), not a raw UnpicklingError

    with pytest.raises(UnsafeFile, match="refusing to unpickle"):
        _read_dcp_state_dict(tmp_path / "evil")
