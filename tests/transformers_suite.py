"""Transformers' own common model tests, fetched at test time from the pinned Transformers version's sdist.

The sdist on PyPI ships `tests/test_modeling_common.py` (`ModelTesterMixin`) and `tests/test_configuration_common.py`
(`ConfigTester`); nothing of them is copied into this project. `pip download` fetches the sdist once into a cache
folder (`$DEPTHBENCH_TRANSFORMERS_TESTS_CACHE`, else `~/.cache/depthbench-nb/transformers-tests/`), pip checks it
against the sha256 pinned below (`--require-hashes`), and the two files are extracted from it into a package of
their own. The same is done for `parameterized` (a pure-Python wheel the two files import; not a project dependency).

The two files import three modules of Transformers' tests tree that the sdist does not ship (`generation/test_utils.py`:
`GenerationTesterMixin`; `exporters/test_export.py`: `ExportTesterMixin`; `utils/test_configuration_utils.py`:
`config_common_kwargs`). They are stand-ins here (`_STAND_INS`), so the generation and export mixins' tests do not
run; with `DEPTHBENCH_TRANSFORMERS_TESTS_TREE` set to the `tests/` folder of a Transformers checkout at the pinned
tag, the real modules are used instead (and `GenerationTesterMixin` runs: see `load`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import zipfile
from pathlib import Path

import transformers

# (version, sha256 of the file on PyPI, pip's file kind): pip refuses any other file (--require-hashes)
PINS = {
    "transformers": ("5.24.0", "906cb8c3cb2123575e263962586a4d21a979ce97feeb95fe6aaf66fe6ae88bf3", "sdist"),
    "parameterized": ("0.9.0", "4e0758e3d41bea3bbd05ec14fc2c24736723f243b28d702081aef438c9372b1b", "wheel"),
}
SDIST_FILES = ("tests/test_modeling_common.py", "tests/test_configuration_common.py")
PACKAGE = "_transformers_sdist_tests"  # the extracted files' package (they import each other relatively)
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class SuiteUnavailable(RuntimeError):
    "The sdist (or parameterized) could not be fetched or checked: the message says what and how to fix it."


def cache_dir() -> Path:
    "Where the verified downloads and the extracted files live (outside the checkout; safe to delete)."
    env = os.environ.get("DEPTHBENCH_TRANSFORMERS_TESTS_CACHE")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "depthbench-nb" / "transformers-tests"
    return Path(env).expanduser() if env else base


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(folder: Path):
    "One process at a time in `folder` (xdist workers collect the module together: one download, not two)."
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch(name: str) -> Path:
    """The pinned file of `name` in the cache: downloaded with pip on first use (hash-checked by pip and again here,
    atomically renamed into place, one process at a time); raises SuiteUnavailable with the reason."""
    with _locked(cache_dir() / f"{name}-{PINS[name][0]}"):
        return _fetch(name)


def _fetch(name: str) -> Path:
    version, sha, kind = PINS[name]
    folder = cache_dir() / f"{name}-{version}"
    done = (
        [p for p in folder.glob(f"{name}-{version}*") if p.is_file() and _sha256(p) == sha] if folder.is_dir() else []
    )
    if done:
        return done[0]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{name}=={version} --hash=sha256:{sha}\n")
        binary = ["--no-binary", ":all:"] if kind == "sdist" else ["--only-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-r", str(req), "-d", tmp]
        proc = subprocess.run(cmd + binary, capture_output=True, text=True, timeout=900, env=_pip_env())
        got = [p for p in Path(tmp).glob(f"{name}-{version}*") if p.is_file()]
        if proc.returncode != 0 or len(got) != 1:
            raise SuiteUnavailable(
                f"Transformers' common model tests need {name}=={version} ({kind}) from PyPI, fetched with pip, and "
                f"the download failed (is PyPI reachable? a proxy set in PIP_INDEX_URL/HTTPS_PROXY?). "
                f"Command: {' '.join(cmd + binary)}\n{(proc.stdout + proc.stderr)[-2000:]}"
            )
        if _sha256(got[0]) != sha:  # pip checked it already; a second look costs nothing
            raise SuiteUnavailable(
                f"{got[0].name}: sha256 {_sha256(got[0])}, pinned {sha} (tests/transformers_suite.py)"
            )
        os.replace(got[0], folder / got[0].name)
        return folder / got[0].name


def _pip_env() -> dict:
    "pip's environment: the network is pip's even when the tests run with the Hugging Face hub offline."
    env = dict(os.environ)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return env


def _extract() -> Path:
    "The sdist's two test files (and an empty __init__.py) in a folder of the cache; returns the folder."
    version = PINS["transformers"][0]
    out = cache_dir() / f"transformers-{version}" / PACKAGE
    with _locked(out.parent):
        return _extract_into(out, version)


def _extract_into(out: Path, version: str) -> Path:
    if all((out / Path(f).name).is_file() for f in SDIST_FILES) and (out / "__init__.py").is_file():
        return out
    sdist = _fetch("transformers")  # under the lock already
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".extract-"))
    with tarfile.open(sdist) as tar:
        for name in SDIST_FILES:
            member = tar.getmember(f"transformers-{version}/{name}")
            (tmp / Path(name).name).write_bytes(tar.extractfile(member).read())
    (tmp / "__init__.py").write_text("")  # test_configuration_common.py executes its folder's __init__.py
    shutil.rmtree(out, ignore_errors=True)  # a partial folder of an interrupted run
    os.replace(tmp, out)
    return out


def _parameterized_path() -> Path:
    "The parameterized wheel unpacked in the cache (pure Python): the folder to put on sys.path."
    wheel = fetch("parameterized")
    out = wheel.parent / "site"
    with _locked(wheel.parent):
        if (out / "parameterized" / "__init__.py").is_file():
            return out
        tmp = Path(tempfile.mkdtemp(dir=wheel.parent, prefix=".unpack-"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        os.replace(tmp, out)
    return out


def _config_common_kwargs() -> dict:
    """Stand-in for `config_common_kwargs` (tests/utils/test_configuration_utils.py, not in the sdist): common
    `PreTrainedConfig` arguments, each away from its default, which a config must keep as given."""
    import torch  # noqa: F401  (ConfigTester compares dtype with torch.float16)

    return dict(
        return_dict=False,
        output_hidden_states=True,
        output_attentions=True,
        dtype="float16",
        chunk_size_feed_forward=5,
        architectures=["BertModel"],
        finetuning_task="translation",
        id2label={0: "label"},
        label2id={"label": "0"},
        tokenizer_class="BertTokenizerFast",
        prefix="prefix",
        problem_type="regression",
    )


def _stand_in(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(f"{PACKAGE}.{name}")
    module.__dict__.update(attrs)
    return module


class _NotShipped:
    "A mixin the sdist does not ship (see the module docstring): no tests."


_STAND_INS = {
    "generation.test_utils": lambda: dict(GenerationTesterMixin=type("GenerationTesterMixin", (_NotShipped,), {})),
    "exporters.test_export": lambda: dict(ExportTesterMixin=type("ExportTesterMixin", (_NotShipped,), {})),
    "utils.test_configuration_utils": lambda: dict(config_common_kwargs=_config_common_kwargs()),
}


def _install_missing(tree: Path | None) -> dict:
    "Register the three modules the sdist lacks: from `tree` when given and present there, else stand-ins."
    real = {}
    for dotted, attrs in _STAND_INS.items():
        parent = dotted.split(".")[0]
        if f"{PACKAGE}.{parent}" not in sys.modules:
            pkg = _stand_in(parent)
            pkg.__path__ = [str(tree / parent)] if tree is not None else []
            sys.modules[f"{PACKAGE}.{parent}"] = pkg
        path = tree / f"{dotted.replace('.', '/')}.py" if tree is not None else None
        if path is not None and path.is_file():
            spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{dotted}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            real[dotted] = True
        else:
            sys.modules[f"{PACKAGE}.{dotted}"] = _stand_in(dotted, **attrs())
            real[dotted] = False
    return real


def load() -> types.SimpleNamespace:
    """Transformers' `ModelTesterMixin`, `ConfigTester`, `GenerationTesterMixin` and helpers, from the pinned sdist;
    `real` says which of the three missing modules are real (DEPTHBENCH_TRANSFORMERS_TESTS_TREE) and which stand-ins.
    Raises SuiteUnavailable when the installed Transformers is not the pinned one or the download fails."""
    version = PINS["transformers"][0]
    if transformers.__version__ != version:
        raise SuiteUnavailable(
            f"Transformers {transformers.__version__} is installed; the suite is pinned to {version} "
            "(requirements-dev.txt): update PINS in tests/transformers_suite.py with the new version and its sdist's "
            "sha256 (pip download --no-deps --no-binary :all: transformers==VERSION; sha256sum the file)"
        )
    if PACKAGE not in sys.modules:
        folder = _extract()
        sys.path.insert(0, str(_parameterized_path()))
        tree = os.environ.get("DEPTHBENCH_TRANSFORMERS_TESTS_TREE")
        spec = importlib.util.spec_from_file_location(
            PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
        package.real = _install_missing(Path(tree).expanduser() if tree else None)
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    generation = sys.modules[f"{PACKAGE}.generation.test_utils"]
    return types.SimpleNamespace(
        ModelTesterMixin=modeling.ModelTesterMixin,
        GenerationTesterMixin=generation.GenerationTesterMixin,
        ConfigTester=configuration.ConfigTester,
        ids_tensor=modeling.ids_tensor,
        real=sys.modules[PACKAGE].real,
        version=version,
    )
