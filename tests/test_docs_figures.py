"""The docs' quick figures equal what the code gives now.

Figures that take seconds to make and are deterministic are made again from the command or
the settings the docs show beside them, and every number of the docs' text or table is
checked against them (to the digits written): the simulator's results table and its 4,096-GPU
sentence (docs/simulator.md), and the bytes of the memory example (docs/distributed.md).
Measurements of this machine (speed, AUC after training) are not here: they live in dated
reports.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from distrec import config
from distrec.cli import main
from distrec.config import chosen_optimizers
from distrec.hotline.row_state import row_state_floats

DOCS = Path(__file__).resolve().parents[1] / "docs"
FLOAT_BYTES = 4


def section(path: Path, heading: str) -> str:
    """The text of a markdown file from ``heading`` (a whole line) to the next heading of any level."""
    text = path.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(r"^#", text[start:], flags=re.M)
    return text[start : start + end.start()] if end else text[start:]


def simulate(capsys, command: str) -> dict:
    """The JSON object that ``distrec simulate ...`` (one shell line) prints last."""
    argv = shlex.split(command)
    assert argv[:2] == ["distrec", "simulate"], command
    capsys.readouterr()
    assert main(argv[1:]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def written(value: float, text: str) -> None:
    """``text`` is ``value`` written with as many decimals as it has (half a unit of its last digit)."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    assert abs(float(text.replace(",", "")) - value) <= 0.5 * 10**-decimals + 1e-9, f"the docs say {text}, the code gives {value}"


def test_the_simulator_results_table_is_what_its_command_prints(capsys):
    results = section(DOCS / "simulator.md", "## Results")
    command = re.search(r"Command: `(distrec simulate [^`]+)`", results)
    assert command, "the Results section names the command its table comes from"
    rows = {(r["hardware"], r["gpus"]): r for r in simulate(capsys, command.group(1))["rows"]}
    table = [line for line in results.splitlines() if re.match(r"\| \d+ \(\d+\) \|", line)]
    header = next(line for line in results.splitlines() if line.startswith("| GPUs"))
    hardware = [re.match(r"\s*(\w+)", cell).group(1) for cell in header.strip("|").split("|")[1:]]
    assert len(table) == 6 and hardware == ["V100", "A100", "H100"]
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        gpus, hosts = map(int, re.match(r"(\d+) \((\d+)\)", cells[0]).groups())
        for name, cell in zip(hardware, cells[1:], strict=True):
            row = rows[(name, gpus)]
            assert row["hosts"] == hosts
            sptt, dmt = cell.split(" / ")
            written(row["speedup_sptt"], sptt)
            written(row["speedup_dmt"], dmt)
    best = max(rows.values(), key=lambda r: r["speedup_dmt"])
    limits = section(DOCS / "simulator.md", "## Limits")
    claim = re.search(r"simulator's best is ([\d.]+)x \((\w+), (\d+)\s+GPUs", limits)
    assert claim and (best["hardware"], best["gpus"]) == (claim.group(2), int(claim.group(3)))
    written(best["speedup_dmt"], claim.group(1))


def test_the_simulators_4096_gpu_sentence_is_what_distrec_simulate_prints(capsys):
    results = section(DOCS / "simulator.md", "## Results")
    sentence = re.search(
        r"at 4,096 H100 DMT x 2D is the fastest scheme, ([\d.]+) ms per iteration against 2D's ([\d.]+)\s+\(strided\) and ([\d.]+) \(contiguous\) and flat's ([\d.]+)",
        results,
    )
    assert sentence, "the Results section compares the schemes at 4,096 H100"
    contiguous = simulate(capsys, "distrec simulate --hardware H100 --schemes flat 2d dmt-2d --gpus 4096")["rows"][0]
    strided = simulate(capsys, "distrec simulate --hardware H100 --schemes 2d --gpus 4096 --replica-layout strided")["rows"][0]
    dmt_2d, two_d_strided, two_d, flat = sentence.groups()
    written(contiguous["dmt-2d_ms"], dmt_2d)
    written(strided["2d_ms"], two_d_strided)
    written(contiguous["2d_ms"], two_d)
    written(contiguous["flat_ms"], flat)
    assert contiguous["dmt-2d_ms"] < min(strided["2d_ms"], contiguous["2d_ms"], contiguous["flat_ms"])


def test_the_memory_examples_bytes_are_those_of_its_tables():
    text = (DOCS / "distributed.md").read_text()
    start = text.index("Eight tables of")
    block = re.search(r"```bash\n(.*?)```", text[start:], flags=re.S)
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    cfg = config.load(None, sets, preset=argv[argv.index("--preset") + 1])
    ranks = int(argv[argv.index("--nproc-per-node") + 1])
    s, dim = cfg.data.synthetic, cfg.model.embedding_dim
    rows = s.num_sparse * s.table_rows
    state_floats = row_state_floats(chosen_optimizers(cfg.train).embedding_optimizer, dim)
    prose = text[start : start + block.end() + 400]
    for value, pattern in [
        (rows * dim * FLOAT_BYTES / 1e9, r"dim \d+ \(([\d.]+) GB\)"),
        (rows * dim * FLOAT_BYTES / ranks / 1e6, r"its ([\d.]+) MB of shards"),
        (rows * state_floats * FLOAT_BYTES / ranks / 1e6, r"their ([\d.]+) MB of row-wise Adagrad state"),
    ]:
        found = re.search(pattern, prose)
        assert found, f"docs/distributed.md's memory example says {pattern!r}"
        written(value, found.group(1))
