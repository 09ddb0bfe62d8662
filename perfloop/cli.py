"""perfloop's command line: one subcommand per module in perfloop/commands/."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path

from perfloop import __version__
from perfloop.commands import bench, check, init, profile, report, run, status, step
from perfloop.commands import next as next_command
from perfloop.core import progress
from perfloop.core.atomic import dumps
from perfloop.core.errors import UserError
from perfloop.report.views import SCHEMA

DESCRIPTION = """\
Make a cuTile kernel faster one measured experiment at a time. Each experiment changes one
thing, runs the kernel's correctness tests, times it against the incumbent in the same
process, commits, and keeps or reverts by the playbook's rules. Results go to
sandbox/<kernel>/perf_results.md (the table) and experiments.jsonl (the full record)."""


COMMANDS = {"run": run, "init": init, "step": step, "next": next_command, "status": status,
            "report": report, "check": check, "bench": bench, "profile": profile}


class ArgumentError(Exception):
    """argparse's complaint, raised instead of printed, so --json can answer in JSON."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgumentError(f"{self.prog}: {message}")


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="perfloop", description=DESCRIPTION,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"perfloop {__version__}")
    subs = top.add_subparsers(dest="command", metavar="COMMAND", required=True,
                              parser_class=Parser)
    for name, module in COMMANDS.items():
        sub = subs.add_parser(name, help=module.HELP, description=module.DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--kernel", required=True, metavar="NAME|PATH",
                         help="a kernel under kernels/ (e.g. swiglu) or a path to a kernel folder")
        sub.add_argument("--playbook", metavar="DIR",
                         help="playbook directory (default: the repository's playbook/)")
        if getattr(module, "JSON", True):
            sub.add_argument("--json", action="store_true",
                             help="answer with one JSON object (schema in README, 'For agents')")
        module.add_arguments(sub)
    return top


def _emit_error(args, message: str, code: int) -> int:
    if getattr(args, "json", False):
        print(dumps({"schema": SCHEMA, "command": args.command, "ok": False,
                     "error": message, "exit_code": code}))
    else:
        print(f"perfloop: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_args(argv)
    except ArgumentError as exc:
        wanted = argparse.Namespace(json="--json" in argv,
                                    command=next((a for a in argv if a in COMMANDS), None))
        return _emit_error(wanted, str(exc), 2)
    module = COMMANDS[args.command]
    progress.configure(json_answer=getattr(args, "json", False))
    try:
        result = module.execute(args)
    except UserError as exc:
        return _emit_error(args, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _emit_error(args, "interrupted; `perfloop run --resume` continues the run", 130)
    except Exception as exc:  # a bug: keep the traceback in a file, show one line
        log = Path(tempfile.gettempdir()) / f"perfloop-crash-{os.getpid()}.log"
        log.write_text(traceback.format_exc())
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return _emit_error(args, f"internal error {type(exc).__name__}: {first} (traceback in "
                                 f"{log}; an interrupted iteration, if any, is finished by "
                                 "`perfloop run --resume`)", 1)
    code = result.pop("exit_code", 0)
    if code:  # a failed experiment or check: its answer says so the way every error does
        result.setdefault("error", result.pop("failure", None) or f"{args.command} failed")
        result["exit_code"] = code
    if getattr(args, "json", False):
        print(dumps({"schema": SCHEMA, "command": args.command, "ok": code == 0, **result}))
    else:
        print(module.render(result))
    return code
