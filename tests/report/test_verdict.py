"""One run's budget verdict (precsim.report.verdict)."""

from __future__ import annotations


def test_a_whole_model_verdict_says_what_its_budget_measures():
    from precsim.report import run_verdict

    summary = {"steps": 8, "info": {"workload": "model"}, "schemes": {"a": {}},
               "figures": {"a": {"final": {"kl": 1e-3, "rel_err": 1e-2}}},
               "cost": {"a": {"bytes_per_step": 100}}}
    assert "the model's own next-token distributions" in run_verdict(summary, "kl", 0.01, ".")
    assert "logits' relative RMS error" in run_verdict(summary, "rel_err", 0.1, ".")
    summary["info"]["workload"] = "synthetic"
    assert "layer output's RMS error" in run_verdict(summary, "rel_err", 0.1, ".")
