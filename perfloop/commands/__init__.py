"""One module per subcommand. Each has HELP, DESCRIPTION, add_arguments(parser),
execute(args) -> dict (JSON-ready; 'exit_code' optional) and render(dict) -> str."""

from perfloop.commands import (
            bench,
            check,
            init,
            next,
            profile,
            report,
            run,
            status,
            step,
)

COMMANDS = {"run": run, "init": init, "step": step, "next": next, "status": status,
            "report": report, "check": check, "bench": bench,
            "profile": profile}
