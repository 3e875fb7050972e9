"""Every ``distrec`` command of README.md and of each subcommand's ``--help`` examples runs.

The commands are read from README.md's ``bash`` code blocks and from the ``examples:`` part of
every ``distrec COMMAND --help``, continuation lines joined and ``#`` comments cut. The
commands of one source run in the order they are written, as a user would type them, in one
scratch directory laid out like a checkout (``configs/`` inside, ``../shared`` beside it) with
a fresh data cache, on the shared real samples. They are scaled down only by the options the
docs name for a quicker try: ``--max-steps`` of ``distrec train`` (README, "A 5-minute tour"),
``--batches`` and ``--train-steps`` of ``distrec bench hotline`` (docs/hotline.md) and ``--sample-rows`` of
``distrec partition`` (docs/dmt.md). Each must exit 0; a Hotline
run of the README must also have engaged Hotline (``popular_fraction`` > 0).

Every command of docs/*.md is checked too, without running it: its options must exist.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from distrec.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# Step limits of the scaled-down runs: a fresh run trains at most FRESH_STEPS steps, a resumed
# one at most RESUMED_STEPS in total, so a resume still has steps left to train.
FRESH_STEPS = 30
RESUMED_STEPS = 60
BENCH_BATCHES = 40
BENCH_TRAIN_STEPS = 10
PARTITION_ROWS = 256

# --help examples not run (matched by the start of the command line), with the reason; every
# command of README.md runs.
HELP_NOT_RUN = {
    # --- need 4 or more processes, more than a 2-core test machine should start ---
    "distrec train --nproc-per-node 4": "4 worker processes",
    "distrec plan collect --devices 4 8": "gloo groups of 4 and 8 processes, about 7 minutes",
    "distrec plan calibrate": "gloo groups of 4 and 8 processes for its budget of minutes",
    # --- depend on the command above, which does not run ---
    "distrec plan train-cost-models": "needs the cost data of 'plan collect --devices 4 8'",
    # --- placeholders for the user's own files, which the shared samples do not provide ---
    "distrec train --config exp.yaml": "exp.yaml stands for the user's experiment config",
    "distrec data prepare --data-format criteo --data day_0.gz": "day_0.gz stands for a Criteo day file",
    "distrec data prepare --data-format csv --data clicks.csv": "clicks.csv and schema.yaml stand for the user's data",
    "distrec plan --tables tables.yaml": "tables.yaml stands for the user's table list",
    "distrec plan --data day_0.gz": "day_0.gz stands for a Criteo day file",
    "distrec train --data day_0.gz": "day_0.gz stands for a Criteo day file",
    "distrec data prepare --data-format criteo --data 'criteo/day_": "criteo/day_*.gz stands for Criteo's day files",
    "distrec data prepare --data-format parquet --data s3://": "an object store this machine cannot reach",
    "distrec evaluate --checkpoint runs/terabyte": "runs/terabyte stands for a run on Criteo's day files",
    # --- run directories that no example before them creates ---
    "distrec partition --checkpoint runs/synth": "no example trains runs/synth",
}

# Commands known to fail today (start of the command line -> why), run as written (not scaled);
# each must still fail, so that a fix shows up here and the entry is removed.
KNOWN_BROKEN: dict[str, str] = {}


def commands_in_text(text: str) -> list[str]:
    """The ``distrec ...`` command lines of ``text``: continuations joined, comments cut."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("distrec "):
            commands.append(shlex.join(shlex.split(line, comments=True)))
    return commands


def markdown_commands(path: Path) -> list[str]:
    """The commands in the ``bash`` code blocks of a Markdown file."""
    blocks = re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    return [c for block in blocks for c in commands_in_text(block)]


def help_example_commands() -> list[str]:
    """The commands in the ``examples:`` epilogs of every subcommand, each epilog once."""
    epilogs: list[str] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if sub.epilog and sub.epilog not in epilogs:
                        epilogs.append(sub.epilog)
                    walk(sub)

    walk(build_parser())
    return [c for epilog in epilogs for c in commands_in_text(epilog)]


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def scaled(argv: list[str]) -> list[str]:
    """``argv`` with the documented quick-try limits applied."""
    argv = list(argv)
    if argv[:2] == ["distrec", "train"]:
        limit = RESUMED_STEPS if "--resume" in argv else FRESH_STEPS
        if "--max-steps" in argv:
            i = argv.index("--max-steps") + 1
            argv[i] = str(min(int(argv[i]), limit))
        else:
            argv += ["--max-steps", str(limit)]
    if argv[:3] == ["distrec", "bench", "hotline"]:
        for option, limit in (("--batches", BENCH_BATCHES), ("--train-steps", BENCH_TRAIN_STEPS)):
            if option not in argv:
                argv += [option, str(limit)]
    if argv[:2] == ["distrec", "partition"] and "--sample-rows" not in argv:
        argv += ["--sample-rows", str(PARTITION_ROWS)]
    return argv


def _matches(command: str, table: dict[str, str]) -> str | None:
    return next((why for start, why in table.items() if command.startswith(start)), None)


def _cases(source: str, commands: list[str]) -> list:
    return [pytest.param(source, i, c, id=f"{source}:{i}:{c[:60]}") for i, c in enumerate(commands)]


README_COMMANDS = markdown_commands(ROOT / "README.md")
HELP_COMMANDS = help_example_commands()


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """One scratch checkout per source: cwd for its commands, ../shared beside it."""
    if not (SHARED / "data").is_dir():
        pytest.skip(f"real data samples not found at {SHARED / 'data'}")
    made: dict[str, Path] = {}

    def checkout(source: str) -> Path:
        if source not in made:
            base = tmp_path_factory.mktemp(source.replace(" ", "-"))
            (base / "shared").symlink_to(SHARED)
            (base / "repo").mkdir()
            (base / "repo" / "configs").symlink_to(ROOT / "configs")
            made[source] = base / "repo"
        return made[source]

    return checkout


@pytest.fixture
def in_checkout(checkouts, monkeypatch, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "docs-examples-cache"
    monkeypatch.setenv("DISTREC_CACHE", str(cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def enter(source: str) -> Path:
        checkout = checkouts(source)
        monkeypatch.chdir(checkout)
        return checkout

    return enter


def _command_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser that handles ``argv`` (``distrec plan collect ...`` -> collect's)."""
    parser = build_parser()
    for word in argv[1:]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def run(argv: list[str]) -> int:
    """Exit status of ``distrec argv[1:]`` run in this process, without progress bars."""
    quiet = "--no-progress" in _command_parser(argv)._option_string_actions
    try:
        return main(argv[1:] + (["--no-progress"] if quiet else []))
    except SystemExit as e:  # argparse errors
        return e.code if isinstance(e.code, int) else 1


@pytest.mark.slow
@pytest.mark.parametrize("source, index, command", _cases("README", README_COMMANDS) + _cases("help", HELP_COMMANDS))
def test_example_runs(source, index, command, in_checkout, capsys):
    why_not = _matches(command, HELP_NOT_RUN) if source == "help" else None
    if why_not:
        pytest.skip(f"not run: {why_not}")
    checkout = in_checkout(source)
    broken = _matches(command, KNOWN_BROKEN)
    argv = shlex.split(command) if broken else scaled(shlex.split(command))  # broken as written
    status = run(argv)
    out, err = capsys.readouterr()
    if broken:
        assert status != 0, f"fixed? remove it from KNOWN_BROKEN: {command}"
        return
    assert status == 0, f"{shlex.join(argv)} exited {status}\n{out[-2000:]}\n{err[-2000:]}"
    if source == "README" and argv[1] == "train" and "--hotline" in argv:
        summary = json.loads((checkout / _option(argv, "--out") / "summary.json").read_text())
        assert summary["hotline"]["popular_fraction"] > 0, f"Hotline never engaged: {summary['hotline']}"


def test_readme_has_a_command_per_technique():
    text = " ".join(README_COMMANDS)
    for fragment in ("distrec train --preset tiny", "--nproc-per-node 2", "--tower-module", "--hotline", "distrec plan"):
        assert fragment in text, fragment


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_docs_commands_use_options_that_exist(page):
    parser = build_parser()
    for command in markdown_commands(page):
        argv = [a for a in shlex.split(command)[1:] if a != "..."]
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{page.name}: {command} does not parse (exit {e.code})")


# pages other branches write; linked before they land
PAGES_WRITTEN_ELSEWHERE = {"performance.md", "neuroshard-vs-torchrec.md"}


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_links_between_pages_resolve(page):
    for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
        path = (page.parent / target).resolve()
        assert path.is_file() or path.name in PAGES_WRITTEN_ELSEWHERE, f"{page.name} links to {target}, which is missing"
