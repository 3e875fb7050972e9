"""summary.json is valid JSON: a metric a run could not compute is null, not NaN."""

import json
import math

from distrec.train.summary import Summary


def test_missing_or_undefined_metrics_are_null_and_the_summary_is_strict_json():
    summary = Summary({"auc": math.nan, "logloss": 0.5, "rows": 10}, 3, 1.0, 100.0, 90, 1, "single", 0, [1], {"stopped": "reached --max-steps"})
    record = summary.to_dict()
    assert record["auc"] is None and record["accuracy"] is None and record["logloss"] == 0.5 and record["val_rows"] == 10
    json.dumps(record, allow_nan=False)  # raises on NaN


def test_a_metrics_log_cut_short_drops_its_last_line_on_resume(tmp_path, capsys):
    import pytest

    from distrec.errors import DistrecError
    from distrec.train.run import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    MetricsLog(path, keep_through_step=2).close()
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    assert "dropping the unfinished last line" in capsys.readouterr().err
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(DistrecError, match="line 2 is not a metrics record"):
        MetricsLog(path, keep_through_step=2)


def test_a_summary_names_the_model_its_metrics_describe():
    from distrec.train.summary import reported_model

    assert reported_model(10, {"auc": 0.7}, None, {}) == {"model": "last"}
    assert reported_model(10, {"auc": 0.7}, 10, {"auc": 0.7}) == {"model": "last", "best_step": 10}
    best = reported_model(15, {"auc": 0.6, "logloss": 0.5}, 10, {"auc": 0.7})
    assert best["model"] == "best" and best["best_step"] == 10 and best["last"]["step"] == 15 and best["last"]["auc"] == 0.6
