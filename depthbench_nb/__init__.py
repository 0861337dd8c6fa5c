__version__ = "0.1.0"
# `python -m depthbench_nb ...` puts the working directory first on sys.path (sys.argv[0] is "-m" while the package is
# found): a yaml.py or a callback module planted there would be imported. Drop that entry before anything is imported.
import sys as _sys  # noqa: E402

_cwd_first = (
    _sys.argv[:1] == ["-m"]
    and not _sys.flags.safe_path
    and bool(_sys.path)
    and _sys.path[0] in ("", __import__("os").getcwd())
)
if _cwd_first:
    del _sys.path[0]
# a signal while the command line starts (its imports take seconds) ends it with exit 3 and one line
from ._hooks import stop_cleanly_at_start as _stop_cleanly_at_start  # noqa: E402

if _cwd_first:  # the `python -m` forms' own `_drop_cwd_entry` leaves sys.path as it is now (a PYTHONPATH entry stays)
    _sys.modules[__name__ + "._hooks"]._cwd_dropped = True

_stop_cleanly_at_start()
# registers with Transformers / lm-eval when they load
from ._hooks import install as _install_hooks  # noqa: E402

_install_hooks()
# the design registry (depthbench_nb.config) is filled by the modules that define the designs, next to their blocks
from . import model as _model, looped as _looped  # noqa: E402,F401
