"""docs/PERFORMANCE.md states what the committed result files in benchmarks/results/ hold: every figure row
benchmarks/performance_doc.py renders from them is in the page, and its generated part is current. Needs neither
torch nor the build."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("performance_doc", ROOT / "benchmarks" / "performance_doc.py")
performance_doc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(performance_doc)


def test_every_rendered_row_is_in_performance_md():
    text = performance_doc.DOCUMENT.read_text(encoding="utf-8")
    rows = performance_doc.table_rows()
    assert len(rows) > 50, "performance_doc rendered almost nothing"
    missing = [row for row in rows if row not in text]
    assert not missing, ("docs/PERFORMANCE.md lacks rows of benchmarks/results/ (python3 benchmarks/performance_doc.py "
                         "--write):\n" + "\n".join(missing))


def test_generated_part_is_current():
    assert performance_doc.main(["--check"]) == 0


def test_check_fails_on_a_changed_figure(tmp_path, monkeypatch):
    stale = performance_doc.DOCUMENT.read_text(encoding="utf-8").replace("| 2 | 34 + 34 |", "| 2 | 35 + 33 |")
    document = tmp_path / "PERFORMANCE.md"
    document.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(performance_doc, "DOCUMENT", document)
    monkeypatch.setattr(performance_doc, "ROOT", tmp_path)
    assert performance_doc.main(["--check"]) == 1
    assert performance_doc.main(["--write"]) == 0 and performance_doc.main(["--check"]) == 0


def test_every_result_file_has_a_section():
    rendered = performance_doc.render()
    for path in sorted(performance_doc.RESULTS.glob("*.json")):
        if path.name == "real_workloads.json":  # its table is checked by test_real_workloads.py
            continue
        assert f"{path.name}`" in rendered, f"{path.name} has no section in docs/PERFORMANCE.md"
