__version__ = "0.1.0"
# a signal while the command line starts (its imports take seconds) ends it with exit 3 and one line
from ._hooks import stop_cleanly_at_start as _stop_cleanly_at_start  # noqa: E402

_stop_cleanly_at_start()
# registers with Transformers / lm-eval when they load
from ._hooks import install as _install_hooks  # noqa: E402

_install_hooks()
# the design registry (depthbench_nb.config) is filled by the modules that define the designs, next to their blocks
from . import model as _model, looped as _looped  # noqa: E402,F401
