"""The plugins' command-line flags: each parsed and checked by its own function, so that a bad value is one line
(``OneLineFlag``); a value that came without the parser is checked by the same function (``Flag.check``),
and a flag that is valid alone but wrong for the model is one line too (``FlagError``, raised while the model is
built). ``Flag`` is one flag as a position scheme declares it (``modules/position_scheme.py``).
"""
import argparse
from dataclasses import dataclass
from typing import Any, Callable


class FlagError(ValueError):
    one_line = True  # fairseq_plugins' excepthook prints the message alone


@dataclass(frozen=True)
class Flag:
    """One flag: ``--name`` on the command line, ``args.name`` (dashes as underscores) after parsing."""
    flag: str  # --t5-num-buckets
    parse: Callable[[str], Any]  # text -> value, ValueError with the message (positive, at_least, one_of)
    metavar: str
    help: str
    default: Any = None  # what position_transformer() fills in when the flag is not given
    switch: bool = False  # given alone (``--learned-pos``): True; parse reads a stored or overridden value
    off: str = ""  # a switch's opposite (``--no-relative-keys``, ``--relative-shared-heads``): False
    off_help: str = ""

    @property
    def dest(self):
        return self.flag.lstrip("-").replace("-", "_")

    def check(self, value):
        """A value set without the parser (``--model-overrides`` on a checkpoint's arguments, a Hydra config): the
        parser's own check (``parse``) of its text, FlagError naming the flag; None is a flag not given."""
        if value is None:
            return
        try:
            parsed = self.parse(str(value))
        except ValueError as err:
            raise FlagError(f"{self.flag} {err}") from None
        if parsed != value or isinstance(parsed, bool) != isinstance(value, bool):  # "0.1" for 0.1, 1 for True
            raise FlagError(f"{self.flag} must be a {type(parsed).__name__}, got {value!r}")

    def parses(self, value) -> bool:
        """Whether the flag's parser takes the value's text."""
        try:
            self.parse(str(value))
        except ValueError:
            return False
        return True

    def add_to(self, parser, listed: bool = True):
        """``listed``: shown by --help (a flag of another scheme than the architecture's is accepted, unlisted)."""
        show = (lambda text: text) if listed else (lambda text: argparse.SUPPRESS)
        if self.switch:  # default None, as every scheme flag's: the scheme's ``defaults`` fills it in
            # argparse cannot format the usage of a mutually exclusive group with unlisted members: unlisted, the
            # pair is plain (the model then refuses any value of it but the default, check_flags_act)
            group = parser.add_mutually_exclusive_group() if self.off and listed else parser
            group.add_argument(self.flag, action="store_true", default=None, help=show(self.help))
            if self.off:
                group.add_argument(self.off, dest=self.dest, action="store_false", default=None,
                                   help=show(self.off_help))
        else:
            parser.add_argument(self.flag, action=OneLineFlag, parse=self.parse, metavar=self.metavar,
                                help=show(self.help))


def add_flags(parser, flags, listed: bool = True):
    """A scheme's flags on the parser (``listed``: shown by --help)."""
    for flag in flags:
        flag.add_to(parser, listed)


def check_flags(args, flags):
    """Each flag's value that the parser could not see (``--model-overrides`` sets them on a checkpoint's
    arguments unparsed), checked by its flag's own parser (``Flag.check``)."""
    for flag in flags:
        flag.check(getattr(args, flag.dest, None))


class OneLineFlag(argparse.Action):
    """A plugin flag parsed and checked by ``parse`` (text → value, ValueError with the message): a bad value
    stops the command with one line on stderr, where argparse's own ``type=``/``choices=`` errors print
    fairseq's whole usage first."""

    def __init__(self, option_strings, dest, parse=str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.parse = parse

    def __call__(self, parser, namespace, text, option_string=None):
        try:
            value = self.parse(text)
        except ValueError as err:
            parser.exit(2, f"{parser.prog}: error: argument {option_string}: {err}\n")
        setattr(namespace, self.dest, value)


def _number(kind, text):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def positive(kind):
    """A finite number (kind float) or an integer (kind int) > 0."""

    def parse(text):
        value = _number(kind, text)
        if not value > 0 or value == float("inf"):
            raise ValueError(f"must be > 0, got {text}")
        return value

    return parse


def at_least(kind, low):
    """A number or an integer >= low."""

    def parse(text):
        value = _number(kind, text)
        if not value >= low:
            raise ValueError(f"must be >= {low}, got {text}")
        return value

    return parse


def boolean(text):
    """True or False, as a switch's value is written (``--model-overrides "{'learned_pos': True}"``)."""
    if str(text) not in ("True", "False"):
        raise ValueError(f"expected True or False, got {text!r}")
    return str(text) == "True"


def one_of(names, why=""):
    def parse(text):
        if text not in names:
            raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(names)}){why}")
        return text

    return parse
