__version__ = "0.1.0"
# registers with Transformers / lm-eval when they load
from ._hooks import install as _install_hooks  # noqa: E402

_install_hooks()
# the design registry (depthbench_nb.config) is filled by the modules that define the designs, next to their blocks
from . import model as _model, looped as _looped  # noqa: E402,F401
