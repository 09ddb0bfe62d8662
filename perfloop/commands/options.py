"""Argument types shared by the subcommands."""

import argparse


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


SETTING_HELP = {   # (metavar, help for a new run)
    "max_control_gap": ("SHARE", "for this run, the most the baseline's A/A control (the same "
                        "code timed twice) may differ at the headline (default: kernel.toml's "
                        "[rules], else rules.toml's [verify]: 0.05 shipped); a busy CPU "
                        "machine may need 0.1"),
    "cliff_ratio": ("RATIO", "for this run, drop a candidate this many times slower than the "
                    "incumbent in its warm-up (default: kernel.toml's [rules], else "
                    "rules.toml's [measure]: 4 shipped; 0: drop none)"),
    "time_budget_s": ("SECONDS", "for this run, the seconds of experiments it may spend "
                      "(default: kernel.toml's [rules], else rules.toml's [stop]: 500 "
                      "shipped; 0: no budget)"),
}
IN_PROGRESS_HELP = {"time_budget_s": "replace the run's time budget, in seconds of experiments, "
                                     "from now on (0: no budget); a run its budget stopped "
                                     "goes on"}


def add_settings(p, at_start: bool = True) -> None:
    """The flags of perfloop.contract.settings (with `at_start` False, only those a run in
    progress takes), each into args under its key."""
    from perfloop.contract import settings

    for s in settings.SETTINGS:
        metavar, text = SETTING_HELP[s.key]
        if at_start:
            p.add_argument(s.flag, dest=s.key, type=number, metavar=metavar, help=text)
        elif not s.pinned_at_start:
            p.add_argument(s.flag, dest=s.key, type=number, metavar=metavar,
                           help=IN_PROGRESS_HELP[s.key])


def overrides(args) -> dict:
    """{key: value} of the settings' flags given, each checked (one line if out of range)."""
    from perfloop.contract import settings

    return {s.key: s.check(getattr(args, s.key), s.flag) for s in settings.SETTINGS
            if getattr(args, s.key, None) is not None}
