"""The ``distrec`` command line. Every user-facing error is one line on stderr, exit 2.

Each subcommand lives in its own module of this package and exposes ``register(sub)``,
which adds its parser to the ``argparse`` subparsers and sets ``handler`` on it: a function
``handler(args, argv) -> exit status``. Add a command by writing such a module and naming
it in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

# distrec's compiled row kernels run on Python threads beside torch's OpenMP pool, whose idle
# workers by default spin between parallel regions and take the cores those threads need
# (benchmarks/results/2026-11-27-cpu-kernels.md). Read once, when torch loads, which
# no import above does; a value the user set wins, and workers inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from distrec import __version__
from distrec.cli import failures  # not its names: ``report`` is also a command module here
from distrec.errors import DistrecError

# module names under distrec.cli, in the order ``distrec --help`` lists them
COMMANDS = ["train", "evaluate", "export", "predict", "data", "report", "plan", "partition", "simulate", "bench"]


def build_parser() -> argparse.ArgumentParser:
    """The full ``distrec`` parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="distrec",
        description="Train large-embedding recommendation models (DLRM, DCN) on one machine or many.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="run 'distrec COMMAND --help' for a command's options and examples",
    )
    parser.add_argument("--version", action="version", version=f"distrec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"distrec.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``distrec`` command; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        with failures.signals_interrupt():
            return handler(args, argv)
    except DistrecError as e:
        failures.report(f"distrec: error: {e}")
        return 2
    except OSError as e:
        if e.filename is None:  # not about a path the user can fix
            raise
        failures.report(f"distrec: error: {failures.os_error_line(e)}")
        return 2
    except KeyboardInterrupt as e:
        status = failures.report_interrupted(e)
        if failures.in_worker():  # stopped mid-step, its gloo and data-loader threads may still want the GIL
            from distrec.parallel.comm import exit_without_finalizing

            exit_without_finalizing(status)
        return status
    except Exception:
        if not failures.in_worker():
            raise
        failures.report(traceback.format_exc().rstrip())  # a bug: its traceback, once, from the first rank that hit it
        return 1
