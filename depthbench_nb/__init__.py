__version__ = "0.1.0"
from ._hooks import install as _install_hooks; _install_hooks()  # registers with Transformers / lm-eval when they load
