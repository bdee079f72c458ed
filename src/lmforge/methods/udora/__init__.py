"""UDora: a unified red-teaming framework against LLM agents by hijacking their reasoning (Zhang et al.,
ICML 2025).

Math: ``scheduling.py`` (weighted interval scheduling of target placements, joint and sequential),
``intervals.py`` (per-position target scores, the splice rules, the surrogate response), ``loss.py``
(the weighted CE / mellowmax gradient loss and the selection loss), ``candidates.py`` (one-hot token
gradients, top-k candidate sampling, the ASCII blocklist, the retokenisation filter). Wiring:
``attack.py`` (the official loop on a prefix KV cache, checkpoint/resume), ``baselines.py`` (GCG with
the target at the first response position, random search). CLI: ``lmforge agent udora``. Official
code: AI-secure/UDora (MIT; read, not copied).
"""

from typing import Any

from lmforge.registry import Method, register


def udora_attack(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.udora.attack.udora_attack` (imported on first call)."""
    from lmforge.methods.udora.attack import udora_attack as fn

    return fn(*args, **kwargs)


register(Method(name="udora", family="agent", paper="UDora: reasoning-hijacking red-teaming of LLM agents (ICML 2025)",
                entry=udora_attack, status="implemented"))
