"""Command line of the sandbox: ``python -m rlvr.sandbox doctor`` (also wired as ``rlvr sandbox doctor``).

What it is: argument parsing and printing around :func:`rlvr.sandbox.doctor.doctor`.
What it is not: a way to run untrusted code from the shell.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sandbox CLI; returns the exit status (0: sandbox usable, 1: weak or unusable, 2: usage)."""
    parser = argparse.ArgumentParser(prog="rlvr sandbox", description="Inspect rlvr's code sandbox.")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor_parser = commands.add_parser("doctor", help="report which protection layers are active here")
    doctor_parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    from rlvr.sandbox.doctor import doctor, doctor_ok, format_doctor_report

    report = doctor()
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else format_doctor_report(report))
    return 0 if doctor_ok(report) else 1


if __name__ == "__main__":
    sys.exit(main())
