"""lmforge: faithful, tested implementations of ICML 2025 language-model methods.

Every method runs on a local Hugging Face checkpoint (``lmforge.models.load``) and every paper's
headline claim has a miniature reproduction (``lmforge reproduce NAME``) built on tiny models that
lmforge trains itself (``lmforge.models.zoo``).
"""

__version__ = "0.1.0"

from lmforge.common.errors import UserError  # noqa: E402  (re-export: the one user-facing error)

__all__ = ["UserError", "__version__"]
