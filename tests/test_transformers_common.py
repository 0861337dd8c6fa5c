"""Transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`; `GenerationTesterMixin` where its module
is available) from the pinned Transformers version's sdist (tests/transformers_suite.py fetches it with pip), run on
the classes an export carries as remote code (trust_remote_code), one test class per design.

The tester is the shape of Transformers' llama tester (tests/causal_lm_tester.py in its repository): 13 rows of 7
tokens, vocabulary 99, width 32, 2 blocks, an attention mask with zeros (tril), the suite's own inputs. Every test
skipped or declared unsupported is in DECLARED with its reason; the Transformers page of the manual lists the same
(`test_manual_lists_the_declared_tests`). Per family in the test command: preln (norm placement), hc (multi-stream),
attnres and block_attnres (depth attention), moda and the looped model; the other designs under `exhaustive`.
Offline for the hub (HF_HUB_OFFLINE=1); pip needs PyPI once per cache; without it: skipped, under CI=true a failure."""

import os
import re
import unittest
from pathlib import Path

import pytest
import torch

import transformers_suite
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL_LM_NAMES

ROOT = Path(__file__).resolve().parent.parent
MANUAL = ROOT / "nbs" / "manual" / "transformers.qmd"

try:
    SUITE, UNAVAILABLE = transformers_suite.load(), None
except transformers_suite.SuiteUnavailable as e:
    SUITE, UNAVAILABLE = None, f"Transformers' common model tests are unavailable: {e}"
    if not transformers_suite.IN_CI:  # CI has PyPI: there a missing suite is a failure (below), never a skip
        pytest.skip(UNAVAILABLE, allow_module_level=True)


def test_the_suite_is_available():
    "Under CI=true the module runs even without the suite, and this test fails with the reason."
    if UNAVAILABLE:
        pytest.fail(UNAVAILABLE, pytrace=False)


FAMILIES = ["preln", "hc", "attnres", "block_attnres", "moda", "looped"]  # one design of each family, in CI
EXHAUSTIVE = ["periln", "lns", "deepnorm", "keel", "mhc"]  # the rest of the designs: pytest -m exhaustive

# Tests skipped or declared unsupported: test (or tester attribute) -> (designs it applies to, reason). The manual's
# table lists the same (test_manual_lists_the_declared_tests).
ALL = "every design"
DECLARED = {
    "has_attentions = False": (
        ALL,
        "attention runs in PyTorch's fused `scaled_dot_product_attention`, which returns no attention "
        "probabilities: `output_attentions` is not offered (the suite's attention-output and eager-vs-SDPA tests "
        "skip themselves)",
    ),
    "test_generation_tester_mixin_inheritance": (
        ALL,
        "`GenerationTesterMixin` (tests/generation/test_utils.py) is not in the sdist; `generate` is tested by the "
        "project's own tests (tests/test_hf.py, tests/test_hf_padding.py)",
    ),
    "test_retain_grad_hidden_states_attentions": (
        "hc, mhc",
        "the multi-stream state is n streams [B, T, n, d]; `hidden_states` are their read-out (the sum, or mHC's "
        "mean), a many-to-one summary that no block computes through, so no gradient reaches it",
    ),
    "test_num_layers_is_small": (
        "looped",
        "the looped model's smallest shape is 6 effective layers (prelude 2, one shared block run twice, coda 2), "
        "above the suite's limit of 2; Transformers' own looped model test is an exception at 4",
    ),
}


def tiny(base: dict, arch: str, tester) -> dict:
    "The export's ModelConfig dict at the tester's shape (the looped model: prelude 2, 1 x 2 loops, coda 2)."
    d = dict(base, vocab_size=tester.vocab_size, d_model=tester.hidden_size, n_head=tester.num_attention_heads)
    d.update(n_kv_head=tester.num_key_value_heads, ffn_hidden=tester.intermediate_size, n_layer=2)
    d.update(max_seq_len=tester.max_position_embeddings)
    if arch == "block_attnres":
        d["attnres_num_blocks"] = 2  # at most the 2L sublayers
    if arch == "looped":
        d.update(n_layer=6, recurrence=2)  # n_layer = 2 + (n_layer - 4) / r * r + 2
    return d


class DepthBenchModelTester:
    "Transformers' llama-style model tester, around an export's remote-code classes."

    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99, hidden_size=32, num_attention_heads=4):
        self.parent, self.batch_size, self.seq_length = parent, batch_size, seq_length
        self.vocab_size, self.hidden_size, self.num_attention_heads = vocab_size, hidden_size, num_attention_heads
        self.num_key_value_heads, self.intermediate_size, self.max_position_embeddings = 2, 37, 512
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2
        self.is_training, self.use_input_mask, self.use_labels = True, True, True
        self.config_class, self.arch = parent.config_class, parent.arch
        self.num_hidden_layers = tiny(parent.base, self.arch, self)["n_layer"]

    def get_config(self):
        return self.config_class(
            depthbench=tiny(self.parent.base, self.arch, self),
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
        )

    def prepare_config_and_inputs(self):
        input_ids = SUITE.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        mask = torch.tril(torch.ones_like(input_ids)) if self.use_input_mask else None  # the llama tester's mask
        labels = SUITE.ids_tensor([self.batch_size, self.seq_length], self.vocab_size) if self.use_labels else None
        return self.get_config(), input_ids, mask, labels

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, mask, _ = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": mask}

    def create_and_check_model(self, config, input_ids, mask, labels):
        model = self.parent.all_model_classes[0](config).eval()
        with torch.no_grad():
            out = model(input_ids, attention_mask=mask, labels=labels)
        self.parent.assertEqual(out.logits.shape, (self.batch_size, self.seq_length, self.vocab_size))
        self.parent.assertTrue(torch.isfinite(out.loss))


@pytest.fixture(scope="session")
def remote_classes(trained_run, tmp_path_factory):
    """Factory: (config class, model class, the export's ModelConfig dict) of a design's export, loaded by remote code
    (trust_remote_code), once per design and process; the copies Transformers makes of the code are removed after."""
    import json
    import shutil

    from transformers import dynamic_module_utils
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from depthbench_nb.hf_export import export_hf

    root, done = tmp_path_factory.mktemp("remote-exports"), {}

    def make(arch: str):
        if arch not in done:
            out = root / f"{arch}_{os.getpid()}"  # Transformers names the remote module after the folder
            export_hf(trained_run(arch), out)
            auto_map = json.loads((out / "config.json").read_text())["auto_map"]  # what trust_remote_code loads
            config_class, model_class = (
                get_class_from_dynamic_module(auto_map[k], out) for k in ("AutoConfig", "AutoModelForCausalLM")
            )
            for cls in (config_class, model_class):
                assert cls.__module__.startswith("transformers_modules."), cls.__module__
            done[arch] = (config_class, model_class, config_class.from_pretrained(out).depthbench)
        return done[arch]

    yield make
    modules = Path(dynamic_module_utils.HF_MODULES_CACHE) / "transformers_modules"
    for arch in done:  # this process's copies (named after its export folders)
        shutil.rmtree(modules / f"{arch}_{os.getpid()}", ignore_errors=True)


@pytest.fixture(scope="class")
def _export_classes(request, remote_classes):
    cls = request.cls
    cls.config_class, model_class, cls.base = remote_classes(cls.arch)
    cls.all_model_classes = (model_class,)


@pytest.mark.usefixtures("_export_classes")
class _DepthBenchCommonTests:
    "The tester's part of Transformers' common tests of one design's remote-code classes (classes per design below)."

    arch = None
    has_attentions = False  # DECLARED
    test_can_init_all_missing_weights_before_2023 = True  # the suite dates a model by its file's copyright line

    def setUp(self):
        # The suite finds causal LMs by name in Transformers' own table (labels for training, the shift_labels
        # check): the export's class is listed there for the test, as a model of Transformers' tree is.
        CAUSAL_LM_NAMES["depthbench"] = "DepthBenchForCausalLM"
        self.addCleanup(CAUSAL_LM_NAMES.pop, "depthbench", None)
        self.model_tester = DepthBenchModelTester(self)
        # an HF name, as llama's tester passes hidden_size=37; 64 because the project's config checks the head
        # width at construction (64 / 16 default heads), where Transformers' configs do not
        self.config_tester = SUITE.ConfigTester(self, config_class=self.config_class, hidden_size=64)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())

    def test_gradient_checkpointing_is_supported(self):
        "The suite's gradient-checkpointing tests pass without testing anything when the class does not support it."
        self.assertTrue(self.all_model_classes[0].supports_gradient_checkpointing)


def _declare(name: str, designs: str, reason: str):
    test = getattr(SUITE.ModelTesterMixin, name)

    def skipped(self, *args, **kwargs):
        if designs == ALL or self.arch in designs.split(", "):
            self.skipTest(reason)
        return test(self, *args, **kwargs)

    skipped.__name__ = name
    return skipped


def _test_class(arch: str) -> type:
    "Transformers' common tests of `arch`: the tester first, then Transformers' mixins (DECLARED overrides theirs)."
    body = {"arch": arch}
    body.update({k: _declare(k, *v) for k, v in DECLARED.items() if k.startswith("test_")})
    if SUITE.real["generation.test_utils"]:  # a full tests tree (DEPTHBENCH_TRANSFORMERS_TESTS_TREE): the real mixin
        body.pop("test_generation_tester_mixin_inheritance")
    bases = (_DepthBenchCommonTests, SUITE.ModelTesterMixin, SUITE.GenerationTesterMixin, unittest.TestCase)
    cls = type(f"Test{arch.title().replace('_', '')}", bases, body)
    return pytest.mark.exhaustive(cls) if arch in EXHAUSTIVE else cls


if SUITE is not None:
    globals().update({cls.__name__: cls for cls in map(_test_class, FAMILIES + EXHAUSTIVE)})


def test_every_design_is_covered():
    from depthbench_nb.config import ARCHS

    assert sorted(FAMILIES + EXHAUSTIVE) == sorted(ARCHS)


def test_manual_lists_the_declared_tests():
    "The manual's table under \"Transformers' own model tests\" is DECLARED: the same tests, designs and reasons."
    section = MANUAL.read_text().split("## Transformers' own model tests", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (.+) \|$", section, re.M)
    assert {name: (designs, reason) for name, designs, reason in rows} == DECLARED
