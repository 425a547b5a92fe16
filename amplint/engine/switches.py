"""What turns AMP on beside the code: the command-line flags a project defines (argparse,
click, typer) and the keys of its config files (YAML, JSON, TOML). Config files are read as
data (YAML is only composed into nodes, never constructed into objects; nothing is run).

A region or a scaler whose ``enabled=`` is ``args.amp`` or ``cfg.SOLVER.AMP.ENABLED`` runs
only when that switch is on; a finding there names it (``enabling.Switch``). The project's
flags and keys are read by ``project_index.flags_named`` and ``config_keys``; this
module reads one file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .outline import parameter_defaults, walk

# Config keys that turn AMP on or pick its precision, and the keys that switch a section of
# that name (`AMP: {ENABLED: true}`, DeepSpeed's `"fp16": {"enabled": true}`).
AMP_KEYS = frozenset({
    "amp", "use_amp", "enable_amp", "amp_enabled", "with_amp", "fp16", "use_fp16", "bf16", "use_bf16",
    "mixed_precision", "use_mixed_precision", "autocast", "use_autocast", "half", "use_half",
    "half_precision", "precision", "amp_dtype"})
_SECTION_SWITCHES = frozenset({"enabled", "enable", "enabled_amp", "dtype"})
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
MAX_CONFIG_BYTES = 256 * 1024  # a bigger file is data, not configuration


@dataclass(frozen=True)
class Flag:
    """A command-line option: ``--amp`` that sets ``args.amp``."""
    path: str  # relative to the project's root
    row: int
    option: str  # "--amp"
    dest: str  # "amp"
    store_true: bool  # a flag that is off unless given
    default: str | None  # the literal default as written; None when not a literal


@dataclass(frozen=True)
class ConfigKey:
    """A key of a config file whose value may turn AMP on: ``SOLVER.AMP.ENABLED: True``."""
    path: str
    row: int
    key: tuple[str, ...]  # ("SOLVER", "AMP", "ENABLED")
    value: str  # as written


_TRUE = frozenset({"true", "yes", "on", "1"})
# Values of a precision key that turn mixed precision on (Lightning, accelerate, Hydra configs).
_MIXED_PRECISIONS = frozenset({"16-mixed", "16", "bf16-mixed", "bf16", "fp16", "float16", "bfloat16", "amp", "mixed"})
_PRECISION_KEYS = frozenset({"precision", "mixed_precision", "amp_dtype"})


def turns_on(key: ConfigKey) -> tuple[bool, str | None]:
    """Whether a config key, as set, turns mixed precision on (``SOLVER.AMP.ENABLED: True``,
    ``precision: 16-mixed``, DeepSpeed's ``fp16.enabled: true``), and the dtype it picks
    (None: the device's own)."""
    names = [k.lower() for k in key.key]
    value = key.value.strip().strip("\"'").lower()
    if names[-1] in _PRECISION_KEYS:
        on = value in _MIXED_PRECISIONS
    else:
        on = value in _TRUE
        if names[-1] in _SECTION_SWITCHES:
            names = names[:-1]
    if not on:
        return False, None
    named = " ".join((*names[-2:], value))
    return True, "bfloat16" if "bf16" in named or "bfloat16" in named else \
        "float16" if any(w in named for w in ("fp16", "16", "half")) else None


def is_amp_key(key: tuple[str, ...]) -> bool:
    last = key[-1].lower()
    return last in AMP_KEYS or last in _SECTION_SWITCHES and any(k.lower() in AMP_KEYS for k in key[:-1])


# -- flags -----------------------------------------------------------------------------------

def may_define_flags(data: bytes) -> bool:
    """The first step of ``flags_in``: the words its calls are spelled with."""
    return b"add_argument" in data or b"option(" in data or b"Option(" in data


def flags_in(tree: ast.Module, path: str) -> list[Flag]:
    """The options a module defines: ``parser.add_argument("--amp", action="store_true")``,
    ``@click.option("--amp", is_flag=True)``, and typer's ``amp: bool = typer.Option(False, "--amp")``."""
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if called in ("add_argument", "option", "Option"):
                flag = _flag(node, path, called)
                if flag is not None:
                    found.append(flag)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _typer_parameters(node, path)
    return sorted(found, key=lambda f: f.row)


def _constant(node: ast.expr | None):
    return node.value if isinstance(node, ast.Constant) else None


def _flag(call: ast.Call, path: str, called: str) -> Flag | None:
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    # click's `--amp/--no-amp` pairs name the option that turns it on first
    options = [n.split("/")[0].strip() for n in names if n.startswith("-")]
    if not options or called == "Option":  # typer's options are read from the parameter
        return None
    option = next((n for n in options if n.startswith("--")), options[0])
    keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
    dest = _constant(keywords.get("dest"))
    if not isinstance(dest, str):  # click's own name for the parameter: a name without dashes
        dest = next((n for n in names if not n.startswith("-")), option.lstrip("-").replace("-", "_"))
    store_true = _constant(keywords.get("action")) == "store_true" or _constant(keywords.get("is_flag")) is True
    default = keywords.get("default")
    written = None if default is None else ast.unparse(default) if isinstance(default, ast.Constant) else None
    if default is None and store_true:
        written = "False"
    return Flag(path, call.lineno, option, dest, store_true, written)


def _typer_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, path: str) -> list[Flag]:
    found = []
    for param, default in parameter_defaults(function.args).items():
        if isinstance(default, ast.Call) and isinstance(default.func, (ast.Attribute, ast.Name)) \
                and (default.func.attr if isinstance(default.func, ast.Attribute) else default.func.id) == "Option":
            names = [_constant(a) for a in default.args[1:]]
            option = next((n for n in names if isinstance(n, str) and n.startswith("--")),
                          "--" + param.arg.replace("_", "-"))
            value = default.args[0] if default.args else None
            written = ast.unparse(value) if isinstance(value, ast.Constant) else None
            found.append(Flag(path, default.lineno, option, param.arg, written == "False", written))
    return found


# -- config files ----------------------------------------------------------------------------

_KEY_WORD = re.compile(r"""["']?\b(?:%s)\b["']?\s*[:=]""" % "|".join(sorted(AMP_KEYS)), re.IGNORECASE)


def may_hold_amp_key(text: str) -> bool:
    """The first step of ``config_keys_in``: some AMP word written as a key."""
    return _KEY_WORD.search(text) is not None


def config_keys_in(text: str, path: str) -> list[ConfigKey]:
    """The AMP keys of one config file (``is_amp_key``) with their rows; none for a file that
    does not parse."""
    if path.endswith(".toml"):
        return _toml_keys(text, path)
    import yaml  # here: most runs read no config file, and the import costs a one-file check 30 ms

    try:  # JSON is read as YAML too: its nodes carry their rows
        documents = list(yaml.compose_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except (yaml.YAMLError, RecursionError, ValueError):
        return []
    found: list[ConfigKey] = []
    for document in documents:
        if document is not None:
            _yaml_keys(document, (), path, found)
    return found


def _yaml_keys(node, prefix: tuple[str, ...], path: str, found: list[ConfigKey]) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            here = (*prefix, str(key.value))
            if isinstance(value, yaml.ScalarNode):
                if is_amp_key(here):
                    found.append(ConfigKey(path, key.start_mark.line + 1, here, value.value))
            else:
                _yaml_keys(value, here, path, found)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _yaml_keys(item, prefix, path, found)


def _toml_keys(text: str, path: str) -> list[ConfigKey]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError):
        return []
    lines = text.splitlines()
    found: list[ConfigKey] = []

    def walk(table: dict, prefix: tuple[str, ...]) -> None:
        for key, value in table.items():
            here = (*prefix, str(key))
            if isinstance(value, dict):
                walk(value, here)
            elif is_amp_key(here) and not isinstance(value, list):
                found.append(ConfigKey(path, _toml_row(lines, here), here, _toml_value(value)))
    walk(data, ())
    return found


def _toml_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else str(value)


def _toml_row(lines: list[str], key: tuple[str, ...]) -> int:
    """The row of ``key``'s assignment: the first one after its table's header (or at the top)."""
    header = re.compile(r"\s*\[\[?\s*" + r"\s*\.\s*".join(re.escape(k) for k in key[:-1]) + r"\s*\]\]?\s*$")
    start = 0
    if len(key) > 1:
        start = next((i for i, line in enumerate(lines) if header.match(line)), 0)
    assignment = re.compile(r"\s*(?:[\w.\"'-]*\.)?[\"']?" + re.escape(key[-1]) + r"[\"']?\s*=")
    return next((i + 1 for i in range(start, len(lines)) if assignment.match(lines[i])), start + 1)
