"""BENCHMARKS.md is the output of ``render`` on the committed results, never
hand-edited, and says what ran it."""

import json
import pathlib
import re

from fxckpt.bench import suites
from fxckpt.bench.page import TITLES, anchor, render

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "benchmarks" / "results.json"
# Words that belong to how the code was written, not to what it measures.
HISTORY = re.compile(r"\bstop [0-9]|\bitem [0-9]|\bissue [0-9]|session", re.IGNORECASE)


def _results() -> dict:
    return json.loads(RESULTS.read_text())


def _synthetic(**ran) -> dict:
    return {"command": "fxckpt bench --all", "date": "2000-01-01 00:00 UTC",
            "machine": {"processor": "Test CPU", "cpus": 2, "threads": 1,
                        "platform": "Linux-test"},
            "versions": {"python": "3.11.0", "torch": "9.9.9", "transformers": "1.2.3",
                         "fxckpt": "abcdef123456"},
            "seconds": 90.0, "cuda_available": False,
            "configs": dict(suites.CONFIGS), "suites": ran}


def test_page_is_render_of_committed_results():
    assert PAGE.read_text() == render(_results())


def test_page_header_names_command_machine_and_versions():
    results, text = _results(), PAGE.read_text()
    head = text.split("\n## ", 1)[0]
    assert "`fxckpt bench --all`" in head
    for value in (*results["versions"].values(), results["machine"]["processor"],
                  results["date"]):
        assert str(value) in head


def test_page_runs_every_cpu_suite_and_names_cuda_commands():
    results, text = _results(), PAGE.read_text()
    assert set(results["suites"]) == set(suites.SUITES)
    assert "Not part of this run." not in text
    assert "fxckpt bench --suite offload --device cuda" in text
    assert "bash .ci/cuda" in text and (ROOT / ".ci" / "cuda").exists()


def test_page_has_no_development_history():
    lines = [line for line in PAGE.read_text().splitlines() if HISTORY.search(line)]
    assert lines == []


def test_render_of_synthetic_results():
    text = render(_synthetic(scratch={"device": "cpu", "size": "tiny", "tolerance": 64,
                                      "threads": 1, "rows": [
                                          {"model": "mlp", "ops": 12, "over": []},
                                          {"model": "cnn", "ops": 30, "over": [
                                              {"op": "aten.convolution", "shapes": "[8, 3]",
                                               "calls": 2, "measured": 4096,
                                               "modeled": 1024}]}]}))
    assert text.startswith("# Benchmarks\n")
    assert "| torch | 9.9.9 |" in text and "| fxckpt | commit abcdef123456 |" in text
    assert "| wall time | 1.5 min |" in text
    assert "| mlp | none of 12 ops | | | | |" in text
    assert "| cnn | aten.convolution | [8, 3] | 2 | 4096 | 1024 |" in text
    assert text.count("Not part of this run.") == 3
    assert "had no CUDA device" in text
    assert text.endswith("```\n")


def test_headings_link_to_their_sections():
    text = render(_synthetic())
    for title in TITLES.values():
        assert f"## {title}\n" in text
        assert f"(#{anchor(title)})" in text


def test_rerender_writes_the_page_from_a_results_file(tmp_path):
    results, target = tmp_path / "results.json", tmp_path / "PAGE.md"
    results.write_text(json.dumps(_synthetic()))
    assert suites.rerender(str(results), str(target)) == 0
    assert target.read_text() == render(_synthetic())
