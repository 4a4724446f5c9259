"""benchmarks/compare.py runs a section end to end and writes its results; the numbers themselves
are measured by the full benchmark on a quiet machine, never in tests (they would be flaky)."""
import subprocess
import sys

COMPARE = ["benchmarks/compare.py"]


def test_a_quick_section_writes_results_with_the_machine_and_its_targets(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, *COMPARE, "--only", "tracking", "--repeats", "1", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed, which a loaded test machine may do
    results = (out / "results.md").read_text()
    assert "CPU:" in results and "Load average" in results and "torch" in results
    assert "## Tracking cost" in results and "default tracking / disabled <= 1.02" in results
    assert len(list(out.glob("tracking/*/*/summary.json"))) == 2  # the run records stay with the results


def test_an_unknown_section_or_a_used_folder_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, *COMPARE, "--only", "speed"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such section" in proc.stderr
    proc = subprocess.run([sys.executable, *COMPARE, "--only", "predict", "--families", "mlp,lstm"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--families lstm: no such model family" in proc.stderr
    (tmp_path / "old.md").write_text("x")
    proc = subprocess.run([sys.executable, *COMPARE, "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "not empty" in proc.stderr
