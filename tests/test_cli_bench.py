import json

from distrec.cli import main


def test_bench_hotline_writes_curves_and_json(tmp_path, capsys):
    out = tmp_path / "out"
    status = main(
        [
            "bench", "hotline", "--preset", "tiny", "--cache-dir", str(tmp_path / "cache"),
            "--set", "data.synthetic.rows=3000", "--set", "data.synthetic.num_sparse=4", "--set", "data.synthetic.table_rows=500",
            "--batch-size", "64", "--batches", "20", "--hot-budget", "4KB", "--sample-rates", "0.5,1",
            "--train-steps", "3", "--no-progress", "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert sorted(p.name for p in out.iterdir()) == ["hotline-bench.json", "hotline-popularity.png", "hotline-recall.png"]
    result = json.loads((out / "hotline-bench.json").read_text())
    brief = json.loads(printed[-1])  # a summary line, the whole result in the file
    assert brief["result"] == str(out / "hotline-bench.json") and len(printed[-1]) < 1000
    assert brief["popular_fraction_at_hot_budget"] == result["popular_fraction_at_hot_budget"]
    assert set(brief["recall_by_sample_rate"]) == {"0.5", "1.0"}
    assert brief["hotline_samples_per_s"] == result["throughput"]["hotline_samples_per_s"]
    curve = result["popularity"]
    assert curve["samples"] == 20 * 64
    assert 4000 in curve["budgets_bytes"]
    assert curve["exact"]["popular_fraction"] == sorted(curve["exact"]["popular_fraction"])
    assert curve["exact"]["popular_fraction"][-1] == 1.0  # the largest default budget holds every row seen
    assert {r["sample_rate"] for r in result["recall"]} == {0.5, 1.0}
    assert result["throughput"]["hotline"]["relearns"] >= 1


def test_bench_hotline_rejects_bad_sample_rates(tmp_path, capsys):
    assert main(["bench", "hotline", "--sample-rates", "0,2", "--out", str(tmp_path)]) == 2
    assert "sample-rates" in capsys.readouterr().err
