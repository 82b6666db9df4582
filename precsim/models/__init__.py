"""Real models (docs/real-models.md): precsim's hooks into the SSM mixers of ``transformers``
checkpoints, recording (``python -m precsim.record``) and whole-model mode
(``experiment=model_kl``).

One home per concern: :mod:`.load` (checkpoints, SSM layers, documents, the output head),
:mod:`.hook` (the scan hook), :mod:`.scan` (a layer's recurrence under every scheme),
:mod:`.parallel` and :mod:`.decode` (the two whole-model modes), :mod:`.metrics` (per-token
metrics and rows), :mod:`.run` (the study), :mod:`.recording` (traces of a document),
:mod:`.placement` (``model.device_map``: one GPU, the scheme batch split, or the layers across
GPUs).
``transformers`` is an optional dependency (``pip install precsim[models]``).
"""

from __future__ import annotations

from .hook import Hook, Step
from .load import ARCHITECTURES, MIXERS, load_model, ssm_layers
from .run import run_model_kl

__all__ = ["ARCHITECTURES", "MIXERS", "Hook", "Step", "load_model", "run_model_kl", "ssm_layers"]
