"""`invoke export` plans: the run's image and model mounted where the run saw them, an output folder never
overwritten, a missing run said plainly. Nothing runs (the export itself: tests/integration/test_export.py)."""

import json

import pytest

from dockyard.common.errors import DockyardError
from dockyard.launch import export


def _run(tmp_path, **extra):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    m = {"run_id": "r1", "status": "completed", "variant": "cpu", "image": {"ref": "mine:1", "id": "sha256:x"}, **extra}
    (run / "manifest.json").write_text(json.dumps(m))
    return m, run


def test_export_runs_in_the_runs_image_with_its_model_mounted_read_only(settings, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    m, run = _run(tmp_path, inputs={"model": {"path": str(model), "inside": "/workspace/inputs/model"}})
    argv, _ = export.plan_export(settings, m, run, tmp_path / "out", merge=True)
    assert f"{model}:/workspace/inputs/model:ro" in argv and f"{tmp_path / 'out'}:/workspace/export" in argv
    assert "--gpus" not in argv
    assert argv[argv.index("mine:1"):] == ["mine:1", "python", "-m", "dockyard.train.export", "--run-dir",
                                           "/workspace/runs/r1", "--out", "/workspace/export", "--merge"]


def test_existing_output_and_missing_runs_are_refused(settings, tmp_path):
    s = settings.model_copy(update={"runs_dir": tmp_path / "runs"})
    _, run = _run(tmp_path)
    (run / "export").mkdir()
    with pytest.raises(DockyardError, match="already exists"):
        export.export(s, run="r1", dry=True)
    with pytest.raises(DockyardError, match="no run 'nope'"):
        export.export(s, run="nope", dry=True)
    m, _ = _run(tmp_path / "b", inputs={"model": {"path": str(tmp_path / "gone"), "inside": "/workspace/inputs/model"}})
    with pytest.raises(DockyardError, match="is gone"):
        export.plan_export(settings, m, run, tmp_path / "o", merge=False)
