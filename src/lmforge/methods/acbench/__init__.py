"""ACBench: agent capabilities of compressed LLMs (Dong et al., ICML 2025).

The suite lives in :mod:`lmforge.bench` (tasks, runner, report; ``lmforge bench acbench``), the
scorers in :mod:`lmforge.eval`, the reproduction in :mod:`lmforge.reproduce.acbench`.
"""

from lmforge.bench.acbench import BenchOptions, run_acbench
from lmforge.registry import Method, register

register(Method(name="acbench", family="bench", paper="ACBench: agent capabilities of compressed LLMs (ICML 2025)",
                config_cls=BenchOptions, entry=run_acbench, status="implemented"))
