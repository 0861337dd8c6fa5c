__version__ = "0.1.0"
from ._hooks import install as _install_hooks; _install_hooks()  # registers with Transformers / lm-eval when they load
# the design registry (depthbench_nb.config) is filled by the modules that define the designs, next to their blocks
from . import model as _model, looped as _looped  # noqa: E402,F401
