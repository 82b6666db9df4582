"""precsim.models.hook: the hook leaves the model as it found it."""

from __future__ import annotations

import pytest
import torch

tf = pytest.importorskip("transformers")

from conftest import ScanCapture  # noqa: E402

from precsim import models  # noqa: E402


def test_hook_restores_the_model(tiny_ckpt, tmp_path):
    model, _ = models.load_model(tiny_ckpt["Mamba2ForCausalLM"])
    ids = torch.tensor([[3, 5, 7, 9]])

    def logits():
        with torch.no_grad():
            return model(input_ids=ids).logits

    before = logits()
    with torch.no_grad(), models.Hook(model, ScanCapture()):
        model(input_ids=ids)
    assert torch.equal(before, logits())
    assert "forward" not in models.ssm_layers(model)[0][1].__dict__
