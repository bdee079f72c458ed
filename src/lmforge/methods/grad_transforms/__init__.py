"""Linear gradient transformations are adapters (Torroba-Hennigen, Lang, Guo, Kim, ICML 2025).

``projectors.py``: the Kronecker projectors (SVD as GaLore, Gaussian sketch, Haar-orthogonal,
two-sided); ``optim.py``: ``ProjectedAdam``/``ProjectedSGD`` with state in the projected space and
refreshes as in galore-torch 1.0; ``adapters.py``: the matching adapters (one-sided LoRA,
``W0 + PΘQᵀ``, PEFT's LoRA set up one-sided) and ``merge_and_rebase``; ``distributed.py``:
data parallelism exchanging r-sized tensors only (shared or
worker-specific projections) on torch.distributed; ``apply.py``: ``build_optimizer`` for
``lmforge train --optimizer galore|sketch|orthogonal|kron``, registered here with the trainer
(:func:`lmforge.common.trainer.register_optimizer`, one projected optimizer per kind).
"""

from functools import partial

from lmforge.common.trainer import OptimizerFactory, register_optimizer
from lmforge.methods.grad_transforms.apply import build_optimizer, train_optimizer
from lmforge.methods.grad_transforms.config import KINDS, GradTransformConfig
from lmforge.registry import Method, register

register(Method(name="grad_transforms", family="peft",
                paper="Linear gradient transformations are adapters (ICML 2025)",
                config_cls=GradTransformConfig, entry=build_optimizer, status="works"))
for _kind in KINDS:
    register_optimizer(OptimizerFactory(name=_kind, build=partial(train_optimizer, _kind), projected=True))
