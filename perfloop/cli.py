"""perfloop's command line: one subcommand per module in perfloop/commands/."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from perfloop import __version__
from perfloop.commands import bench, check, init, profile, report, run, status, step
from perfloop.commands import next as next_command
from perfloop.core import progress
from perfloop.isolation import spawn
from perfloop.core.atomic import dumps
from perfloop.core.errors import Terminated, UserError, first_line, keep_traceback
from perfloop.measure import process
from perfloop.run import recorded
from perfloop.report.views import SCHEMA
from perfloop.store import preflight

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
    def __init__(self, *args, json_help: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.json_help = json_help

    def error(self, message):
        raise ArgumentError(f"{self.prog}: {message}")

    def print_help(self, file=None):
        """With --json, the help is one JSON object too: {..., "ok": true, "help": text}."""
        if not self.json_help:
            return super().print_help(file)
        command = self.prog.split()[1] if " " in self.prog else None
        print(dumps({"schema": SCHEMA, "command": command, "ok": True,
                     "help": self.format_help()}), file=file or sys.stdout)


class Version(argparse.Action):
    """--version; with --json one JSON object, shaped like --help's."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show perfloop's version and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        if parser.json_help:
            print(dumps({"schema": SCHEMA, "command": None, "ok": True,
                         "version": __version__}))
        else:
            print(f"perfloop {__version__}")
        parser.exit()


def parser(json_help: bool = False) -> argparse.ArgumentParser:
    top = Parser(prog="perfloop", description=DESCRIPTION, json_help=json_help,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action=Version)
    subs = top.add_subparsers(dest="command", metavar="COMMAND", required=True,
                              parser_class=Parser)
    for name, module in COMMANDS.items():
        sub = subs.add_parser(name, help=module.HELP, description=module.DESCRIPTION,
                              json_help=json_help,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        if getattr(module, "KERNELS", 1) == "optional":   # (report --all)
            sub.add_argument("--kernel", metavar="NAME|PATH",
                             help="a kernel under kernels/ (e.g. swiglu) or a path to a "
                                  "kernel folder")
        elif getattr(module, "KERNELS", 1) == 1:
            sub.add_argument("--kernel", required=True, metavar="NAME|PATH",
                             help="a kernel under kernels/ (e.g. swiglu) or a path to a "
                                  "kernel folder")
        else:   # (run: several kernels at once, on a fleet)
            sub.add_argument("--kernel", action="append", metavar="NAME|PATH",
                             help="a kernel under kernels/ (e.g. swiglu) or a path to a "
                                  "kernel folder; more than one (or --all) runs them at once "
                                  "on a fleet (--gpus, --workers or --scheduler)")
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


def _internal(args, exc: Exception) -> int:
    """A bug: keep the traceback in a file, show one line."""
    log = keep_traceback()
    first = first_line(exc)
    after = getattr(exc, recorded.NOTE, None)
    if after:  # past an experiment's record line: say that first (docs/agent-protocol.md)
        return _emit_error(args, f"{after[0]}, but an internal error followed: "
                                 f"{type(exc).__name__}: {first} (traceback in {log}); "
                                 f"{after[1]}", 1)
    return _emit_error(args, f"internal error {type(exc).__name__}: {first} (traceback in "
                             f"{log}; an interrupted iteration, if any, is finished by "
                             "`perfloop run --resume`)", 1)


def main(argv: list[str] | None = None) -> int:
    # the user's environment (keys, tokens) is perfloop's to keep from kernel code, which may
    # read the /proc entries of its user's processes: this one's are closed
    spawn.set_dumpable(False)
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        # the reader left (`perfloop status | head -1`): nothing more to tell it; stdout goes
        # to /dev/null so that Python's flush at exit does not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _terminated(signum, frame):
    """SIGTERM is taken as Ctrl-C is, once: a second one would cut short the clean-up that
    records the interruption (kill -9 still ends perfloop at once, and resume copes)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def _resume_hint(args) -> str:
    """Only init, run and step leave a run to resume; check, bench and the readers leave none."""
    if args.command in ("init", "run", "step"):
        return "; `perfloop run --resume` continues the run"
    return ""


def _main(argv: list[str]) -> int:
    try:
        args = parser(json_help="--json" in argv).parse_args(argv)
    except ArgumentError as exc:
        wanted = argparse.Namespace(json="--json" in argv,
                                    command=next((a for a in argv if a in COMMANDS), None))
        return _emit_error(wanted, str(exc), 2)
    module = COMMANDS[args.command]
    progress.configure(json_answer=getattr(args, "json", False))
    spawn.become_subreaper()  # daemons that kernel code leaves come back here, to be killed
    signal.signal(signal.SIGTERM, _terminated)
    try:
        result = module.execute(args)
    except UserError as exc:
        return _emit_error(args, str(exc), exc.exit_code)
    except Terminated:
        return _emit_error(args, "terminated (SIGTERM)" + _resume_hint(args), Terminated.exit_code)
    except KeyboardInterrupt:
        return _emit_error(args, "interrupted" + _resume_hint(args), 130)
    except BrokenPipeError as exc:  # a child's pipe, not the reader's (nothing printed yet)
        return _internal(args, exc)
    except OSError as exc:
        failure = preflight.from_os_error(exc)
        if failure is None:
            return _internal(args, exc)
        return _emit_error(args, str(failure), failure.exit_code)
    except Exception as exc:
        return _internal(args, exc)
    finally:
        process.kill_strays()
    code = result.pop("exit_code", 0)
    if code:  # a failed experiment or check: its answer says so the way every error does
        result.setdefault("error", result.pop("failure", None) or f"{args.command} failed")
        result["exit_code"] = code
    if getattr(args, "json", False):
        print(dumps({"schema": SCHEMA, "command": args.command, "ok": code == 0, **result}))
    else:
        print(module.render(result))
    return code
