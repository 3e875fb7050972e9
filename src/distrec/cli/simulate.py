"""``distrec simulate``: predicted iteration time and DMT speedups at scales this machine cannot run."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict iteration times of flat, SPTT and DMT training")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    return 0
