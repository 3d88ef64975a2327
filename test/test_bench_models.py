"""bench/models.py's smoke test (--quick sizes, in this process): the models written once for torch.nn and
tinychad.nn build in both, the tinychad ones agree with their torch twins before timing, TinyJit runs the
training step, and the table prints every variant with its reasons."""
from __future__ import annotations
import pytest
from bench import models

pytest.importorskip("torch")
# torch's TransformerEncoder notes that norm_first layers take its plain path (bench/models.py silences it too)
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")


def rows(*prefixes: str) -> list[str]:
  return [w.name for w in models.workloads(True) if w.name.startswith(prefixes)]


def test_lstm_and_generation_rows_check_against_torch_and_time():
  reports = models.run_variant("tinychad eager", True, rows("LSTM", "GPT generation"))
  assert [r["case"] for r in reports] == rows("LSTM", "GPT generation")
  for report in reports:
    assert "error" not in report, report
    assert report["max_diff"] < models.CHECK_ATOL and report["median_s"] > 0


def test_tinyjit_variant_runs_training_and_says_why_it_skips_generation():
  reports = {r["case"]: r for r in models.run_variant("tinychad TinyJit", True, rows("LSTM", "GPT generation"))}
  assert reports[rows("LSTM")[0]]["median_s"] > 0
  assert "shapes change" in reports[rows("GPT generation")[0]]["error"]


def test_vit_written_for_torch_loads_into_tinychad():
  """The ViT is TransformerEncoder layers: the state dict names and the output must agree."""
  (report,) = models.run_variant("tinychad eager", True, rows("ViT"))
  assert "error" not in report, report


def test_table_has_every_variant_ratios_and_footnotes():
  quick = models.workloads(True)
  results = {variant: {w.name: {"median_s": 0.01 * (i + 1), "first_s": 1.0} for w in quick}
             for i, variant in enumerate(models.VARIANTS[:3])}
  results["tinygrad"] = {w.name: {"error": w.tinygrad_reason or "tinygrad is not installed"} for w in quick}
  results["tinychad eager"][quick[0].name]["max_diff"] = 1e-6
  table = models.format_table(True, results)
  header, _, first_row = table.splitlines()[:3]
  assert all(variant in header for variant in models.VARIANTS)
  assert "| 10.0 | 20.0 | 30.0 | n/a [1] | 1.0 | 0.33x | 0.67x | - |" in first_row   # eager, TinyJit, torch (ms)
  assert "tinygrad.nn has no LSTM" in table and "1.0e-06" in table
