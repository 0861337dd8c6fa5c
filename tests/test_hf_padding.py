"""Padded batches and the cache through Transformers, on exports of tiny trained runs (Pre-LN, HC, Full and Block
AttnRes, MoDA, the looped model): a left- or right-padded batch gives each row what it gives alone (logits, greedy
`generate`, the training loss with -100 labels); assisted and prompt-lookup decoding equal plain greedy; a padded
prefill continues from the cache; `torch.export` takes the mask; lm-eval's `hf` backend and ours agree at batch sizes
1 and 8."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from depthbench_nb.hf import GenerationCache
from depthbench_nb.hf_export import export_hf

DESIGNS = ["preln", "hc", "attnres", "block_attnres", "moda", "looped"]
TEXTS = [  # three prompts of different lengths (KJV)
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light:",
    "And the evening and the morning were the first day. And God saw the light, that it was good.",
]
NEW = 6
ATOL = 1e-5


@pytest.fixture(scope="session")
def export(trained_run, tmp_path_factory):
    "Factory: (model, tokenizer, folder) of a design's export, loaded with the Auto classes, once per session."
    root, done = tmp_path_factory.mktemp("padding-exports"), {}

    def make(arch: str):
        if arch not in done:
            export_hf(trained_run(arch), root / arch)
            model = AutoModelForCausalLM.from_pretrained(root / arch).eval()
            done[arch] = (model, AutoTokenizer.from_pretrained(root / arch), root / arch)
        return done[arch]

    return make


def ids_of(tok) -> list[torch.Tensor]:
    return [torch.tensor(tok(t).input_ids) for t in TEXTS]


def padded(rows: list[torch.Tensor], side: str, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    "rows -> (ids [B, T], mask [B, T]) padded on `side` with `pad`."
    T = max(len(r) for r in rows)
    ids, mask = torch.full((len(rows), T), pad), torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        where = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, where], mask[i, where] = r, 1
    return ids, mask


@pytest.mark.parametrize("arch", DESIGNS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_logits_equal_each_prompt_alone(arch, side, export):
    model, tok, _ = export(arch)
    rows = ids_of(tok)
    ids, mask = padded(rows, side)
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits  # [B, T, V]
        for i, r in enumerate(rows):
            alone = model(r[None]).logits[0]  # [T_i, V]
            diff = (got[i][mask[i].bool()] - alone).abs().max().item()
            assert diff <= ATOL, (arch, side, i, diff)


@pytest.mark.parametrize("arch", DESIGNS)
def test_left_padded_generate_equals_each_prompt_alone(arch, export):
    model, tok, _ = export(arch)
    rows = ids_of(tok)
    ids, mask = padded(rows, "left")
    greedy = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = model.generate(ids, attention_mask=mask, **greedy)[:, ids.shape[1] :]  # [B, NEW]
    for i, r in enumerate(rows):
        alone = model.generate(r[None], **greedy)[0, len(r) :]
        assert torch.equal(got[i], alone), (arch, i, got[i].tolist(), alone.tolist())
    beams = model.generate(ids, attention_mask=mask, num_beams=2, **greedy)[:, ids.shape[1] :]
    for i, r in enumerate(rows):  # beam search reorders the cache's rows and its mask together
        assert torch.equal(beams[i], model.generate(r[None], num_beams=2, **greedy)[0, len(r) :]), (arch, i)


def _labels(ids, mask):
    "Labels of a padded batch: -100 on the padding and on a token no real token predicts (a row's first)."
    labels = ids.masked_fill(mask == 0, -100)
    prev_real = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)
    return labels.masked_fill(prev_real == 0, -100)


@pytest.mark.parametrize("arch", DESIGNS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_training_step_gives_the_loss_of_the_rows(arch, side, export):
    model, tok, _ = export(arch)
    rows = ids_of(tok)
    ids, mask = padded(rows, side)
    model.zero_grad()
    loss = model(ids, attention_mask=mask, labels=_labels(ids, mask)).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total, n = 0.0, sum(len(r) - 1 for r in rows)
    for r in rows:  # each row alone: summed next-token cross-entropy
        logits = model(r[None], use_cache=False).logits[0]
        total = total + F.cross_entropy(logits[:-1].float(), r[1:], reduction="sum")
    ref = total / n
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-5, (arch, side, loss.item(), ref.item())
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[name], p.grad, atol=1e-5, rtol=1e-4), (arch, side, name)
    model.zero_grad()


@pytest.mark.parametrize("arch", ["preln", "hc", "moda", "looped"])
def test_assisted_and_prompt_lookup_decoding_equal_greedy(arch, export):
    model, tok, _ = export(arch)
    prompt = torch.tensor(tok(TEXTS[2] + " " + TEXTS[2]).input_ids)[None]  # repeats: prompt lookup finds drafts
    greedy = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    plain = model.generate(prompt, **greedy)
    assert torch.equal(model.generate(prompt, prompt_lookup_num_tokens=3, **greedy), plain), arch
    assert torch.equal(model.generate(prompt, assistant_model=model, **greedy), plain), arch
    other, _, _ = export("attnres" if arch != "attnres" else "preln")  # a different draft model: drafts rejected
    if other.config.vocab_size == model.config.vocab_size:
        assert torch.equal(model.generate(prompt, assistant_model=other, **greedy), plain), arch


@pytest.mark.parametrize("arch", ["preln", "moda", "looped"])
def test_padded_prefill_continues_from_the_cache(arch, export):
    model, tok, _ = export(arch)
    rows = ids_of(tok)
    ids, mask = padded(rows, "left")
    nxt = torch.tensor([[5], [7], [9]])
    with torch.no_grad():
        first = model(ids, attention_mask=mask)
        assert isinstance(first.cache, GenerationCache) and torch.equal(first.cache.mask, mask.bool())
        cache = first.cache
        step = model(nxt, cache=cache).logits[:, -1]  # no mask: the cache's own, then a real token
        step2 = model(nxt, cache=cache, attention_mask=torch.cat([mask, torch.ones(3, 2, dtype=torch.long)], 1))
        for i, r in enumerate(rows):
            alone = model(torch.cat([r, nxt[i], nxt[i]])[None]).logits[0]
            assert (step[i] - alone[-2]).abs().max() <= ATOL, (arch, i)
            assert (step2.logits[i, -1] - alone[-1]).abs().max() <= ATOL, (arch, i)
        cache.crop(-1)  # assisted decoding's rollback: the mask shrinks with the keys
        assert cache.get_seq_length() == ids.shape[1] + 1 and cache.mask.shape == (3, ids.shape[1] + 1)
        again = model(nxt, cache=cache).logits[:, -1]
        assert (again - step2.logits[:, -1]).abs().max() <= ATOL


@pytest.mark.parametrize("arch", ["preln", "looped"])
def test_torch_export_takes_the_padding_mask(arch, export):
    model, tok, _ = export(arch)
    ids, mask = padded(ids_of(tok), "left")
    kw = dict(use_cache=False)
    program = torch.export.export(model, args=(), kwargs=dict(input_ids=ids, attention_mask=mask, **kw))
    _, other = padded(ids_of(tok)[::-1], "right")  # another mask of the same shape: the graph reads the mask
    for m in (mask, other, torch.ones_like(mask)):
        got = program.module()(input_ids=ids, attention_mask=m, **kw).logits
        want = model(ids, attention_mask=m, **kw).logits
        assert (got - want).abs().max() <= ATOL, arch


def test_lm_eval_hf_backend_and_ours_agree_at_batch_sizes_1_and_8(export):
    lm_eval = pytest.importorskip("lm_eval")
    from pathlib import Path

    from lm_eval.tasks import TaskManager

    _, _, folder = export("hc")
    tasks = TaskManager(include_path=str(Path(__file__).parent / "data" / "lm_eval"), include_defaults=False)
    names = ["depthbench_tiny_choice", "depthbench_tiny_generate"]

    def run(backend, bs):
        extra = ",dtype=float32" if backend == "hf" else ""
        out = lm_eval.simple_evaluate(
            model=backend,
            model_args=f"pretrained={folder}{extra}",
            tasks=names,
            task_manager=tasks,
            batch_size=bs,
            device="cpu",
            log_samples=True,
        )["samples"]
        lls = [r[0][0] for s in out[names[0]] for r in s["resps"]]
        gens = [s["resps"][0][0] for s in out[names[1]]]
        return lls, gens

    ours1, ours8, hf1, hf8 = run("depthbench", 1), run("depthbench", 8), run("hf", 1), run("hf", 8)
    assert len(ours1[0]) == 18 and len(ours1[1]) > 1
    for lls, gens in (ours8, hf1, hf8):
        assert max(abs(a - b) for a, b in zip(lls, ours1[0])) <= 1e-4
        assert gens == ours1[1]
