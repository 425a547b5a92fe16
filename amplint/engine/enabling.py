"""Which switch turns a region or a scaler on, when an expression decides (``enabled=args.amp``):
the words a finding there applies under, and where the switch is set — a command-line flag or
a config key of the project (``switches``), a parameter and its default, or else the expression
itself; and how a finding names the project's autocast site it rests on (``enabling_site``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from .ast_context import AstContext
from .diagnostics import Related
from .project_index import AutocastSite, project_name, relative_name, switched_setting
from .flow import key
from .outline import dotted, parameter_defaults
from .regions import autocast_arguments, literal_bool, value_before
from .semantics import GRAD_SCALER
from .switches import ConfigKey, Flag


@dataclass(frozen=True)
class Switch:
    when: str  # "when `--amp` is set (train.py:42)"
    related: tuple[Related, ...] = ()


def region_switch(ctx: AstContext, ac, device: bool = True, dtype: bool = False) -> Switch | None:
    """What an autocast region (``regions.AutocastCall``) applies
    under when expressions decide it: its ``enabled=`` (``switch_of``) and, with ``device``,
    its device (``device_type=str(device)``: judged as the configured device, "when `device`
    is cuda"); with ``dtype``, its float16 given by a project function (``float16_choice``);
    None when literals do."""
    args, positional = _arguments(ac.node)
    parts = []
    if ac.chosen_by is not None:
        parts.append(_chosen(ctx, ac.chosen_by, ac.chosen_when))
    if ac.enabled is None and "enabled" in args:
        parts.append(switch_of(ctx, args["enabled"]))
    given = args.get("device_type", positional[0] if positional and not ac.deprecated_api else None)
    if device and ac.device is None and given is not None:
        parts.append(Switch(f"when `{ctx.code(given)}` is {ctx.policy().device}"))
    if dtype and (chosen := float16_choice(ctx, ac)) is not None:
        parts.append(chosen)
    if not parts:
        return None
    when = " and ".join([parts[0].when, *(p.when.removeprefix("when ") for p in parts[1:])])
    return Switch(when, tuple(r for p in parts for r in p.related))


def _function_dtype(ctx: AstContext, ac) -> tuple[ast.expr, str, tuple] | None:
    """For a region whose ``dtype=`` is the value of a project function or property
    (``cfg.autocast_precision``, ``get_amp_dtype(...)``): that expression, the name, and the
    dtypes the project's definitions of it give back (``project_index.dtype_choices``)."""
    if ac.dtype is not None or not ac.dtype_given:
        return None
    given = autocast_arguments(ac).get("dtype")
    called = isinstance(given, ast.Call)
    expr = given.func if called else given
    if isinstance(expr, ast.Attribute):
        name = expr.attr
    elif called and isinstance(expr, ast.Name):
        name = expr.id
    else:
        return None  # a plain name is a value bound in this file, not a function's
    return given, name, ctx.dtype_choices(name, not called)


def _returned(ctx: AstContext, choice, message: str) -> Related:
    """Where a project function gives back one of its dtypes, as a related location."""
    return Related(relative_name((ctx.project_root() / choice.path).resolve(), Path.cwd()), choice.row, message)


def float16_choice(ctx: AstContext, ac) -> Switch | None:
    """For a region whose dtype a project function or property gives (``_function_dtype``):
    the first place it gives torch.float16, as the switch the region is float16 under; None
    when it gives none, or the dtype is anything else."""
    found = _function_dtype(ctx, ac)
    choice = next((c for c in found[2] if c.dtype == "float16"), None) if found is not None else None
    if choice is None:
        return None
    given, name, _ = found
    where = f"{choice.path}:{choice.row}"
    test = choice.when if choice.when is None or len(choice.when) <= 80 else choice.when[:77] + "..."
    related = _returned(ctx, choice, f"`{name}` gives torch.float16" + (f" where `{test}`" if test else ""))
    return Switch(f"when `{ctx.code(given)}` is torch.float16"
                  + (f", where `{test}` ({where})" if test else f" ({where})"), (related,))


def config_choice(ctx: AstContext, ac, dtype: str) -> tuple[Switch, ast.expr] | None:
    """For a region whose ``dtype=`` is what a project function gives for a value read from
    the config (``get_amp_type(cfg.amp.amp_dtype)``), where the function returns ``dtype``
    when its parameter equals a string (``if amp_type == "bfloat16": return torch.bfloat16``):
    the config keys set to that string, as the switch the region runs in ``dtype`` under, and
    the value's expression; None otherwise."""
    found = _function_dtype(ctx, ac)
    if found is None or not isinstance(found[0], ast.Call):
        return None
    given, name, choices = found
    for choice in choices:
        tested = _string_test(choice.when) if choice.dtype == dtype and choice.when else None
        if tested is None:
            continue
        parameter, strings = tested
        argument = _argument_for(given, choice.parameters, parameter)
        chain = dotted(argument) if argument is not None else None
        if chain is None or len(chain) < 2:  # a config object's attribute: `cfg.amp_dtype`
            continue
        keys = [k for k in _keys_read_by(ctx, chain) if k.value.strip("\"'") in strings]
        if not keys:
            continue
        where, related = _place(ctx, keys, f"`{'.'.join(keys[0].key)}: {keys[0].value}`")
        returned = _returned(ctx, choice, f"`{name}` gives torch.{dtype} where `{choice.when}`")
        return Switch(f"with `{'.'.join(keys[0].key)}: {keys[0].value}` ({where}), for which `{name}` gives "
                      f"torch.{dtype} ({choice.path}:{choice.row})", (related, returned)), argument
    return None


def _string_test(when: str) -> tuple[str, frozenset[str]] | None:
    """A test of a parameter against strings: ``p == "bf16"``, ``"bf16" == p``, ``p in ("bf16",
    "bfloat16")``, as the parameter and the strings that make it hold."""
    try:
        test = ast.parse(when, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq) and isinstance(right, ast.Name):
        left, right = right, left
    if not isinstance(left, ast.Name):
        return None
    if isinstance(op, ast.Eq):
        values = [right]
    elif isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        values = right.elts
    else:
        return None
    if not all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
        return None
    return left.id, frozenset(v.value for v in values)


def _argument_for(call: ast.Call, parameters: tuple[str, ...], parameter: str) -> ast.expr | None:
    """What ``call`` passes for ``parameter`` of the function it calls (a method's ``self``
    or ``cls`` taken by its receiver); None when it passes nothing for it, or ``*args``."""
    named = next((k.value for k in call.keywords if k.arg == parameter), None)
    if named is not None or parameter not in parameters:
        return named
    index = parameters.index(parameter)
    if isinstance(call.func, ast.Attribute) and parameters[0] in ("self", "cls"):
        index -= 1
    before = call.args[:index + 1]
    if index < 0 or len(before) <= index or any(isinstance(a, ast.Starred) for a in before):
        return None
    return call.args[index]


def _arguments(call: ast.Call) -> tuple[dict, list]:
    """A call's arguments by keyword, and its positional ones before any ``*args``."""
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    return {k.arg: k.value for k in call.keywords if k.arg is not None}, positional


def _chosen(ctx: AstContext, condition, when: bool) -> Switch:
    """The switch of a region chosen by ``condition`` over a context that does nothing: when it
    holds (``when``), or when it does not (``nullcontext() if not amp else autocast(...)``)."""
    if not when and isinstance(condition, ast.UnaryOp) and isinstance(condition.op, ast.Not):
        condition, when = condition.operand, True
    return switch_of(ctx, condition) if when else Switch(f"when `{ctx.code(condition)}` is false")


def scaler_switch(ctx: AstContext, scaler: str) -> Switch | None:
    """The switch of the GradScaler the file assigns to ``scaler`` (its text as ``flow.key``
    spells it, ``self.scaler``) with ``enabled=`` an expression: a finding about its scaling
    applies only when it is on. None when the file makes it otherwise, or in more than one way."""
    made = [node.value for node in ctx.outline.nodes(ast.Assign)
            if isinstance(node.value, ast.Call) and ctx.resolves_to(node.value.func, GRAD_SCALER)
            and any(key(ctx, t) == scaler for t in node.targets)]
    enabled = [next((k.value for k in call.keywords if k.arg == "enabled"), None) for call in made]
    if len(enabled) != 1 or enabled[0] is None or literal_bool(enabled[0]) is not None:
        return None
    return switch_of(ctx, enabled[0])


def setting_switch(ctx: AstContext, site) -> Switch:
    """What a framework setting of the project (``project_index.AutocastSite``) applies under:
    one a training script makes behind an ``if`` (``if args.amp: cfg.optim_wrapper.type =
    'AmpOptimWrapper'``) when that test's switch is on ("when `--amp` is set
    (tools/train.py:20), as tools/train.py:31 sets ..."), else the setting itself, with its place."""
    root = ctx.project_root()
    place = Related(site.shown_path(), site.row, f"`{site.setting}`")
    try:
        parsed = ast.parse(site.setting).body[0] if switched_setting(site) else None
    except (SyntaxError, IndexError):
        parsed = None
    if not isinstance(parsed, ast.If) or root is None:
        return Switch(f"with {site.where(root) if root is not None else site.setting}", (place,))
    test = parsed.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.Eq)) \
            and literal_bool(test.comparators[0]) is True:
        test = test.left  # `args.amp is True`
    switch = switch_of(ctx, test)
    where = f"{project_name(site.path, root)}:{site.row}"
    return Switch(f"{switch.when}, as {where} sets `{ast.unparse(parsed.body[0])}`", (*switch.related, place))


def switch_of(ctx: AstContext, expr) -> Switch:
    """The switch ``expr`` stands for: ``args.amp`` for the project's ``--amp`` flag,
    ``cfg.SOLVER.AMP.ENABLED`` for that key of a config file, a parameter for its default."""
    chain = _chain(expr)
    found = named_switch(ctx, chain) if chain is not None else None
    if found is not None:
        return found
    if isinstance(expr, ast.Name):
        found = _parameter(ctx, expr)
        if found is not None:
            return found
    return Switch(f"when `{ctx.code(expr)}` is true")


def named_switch(ctx: AstContext, chain: list[str]) -> Switch | None:
    """The command-line flag or config key of the project that a chain of names read from an
    object stands for (``args.amp`` → [args, amp])."""
    # `self.use_amp` is the object's own attribute, not a flag or a key
    if len(chain) < 2 or chain[0] == "self" and len(chain) == 2:
        return None
    return _flag(ctx, chain) or _config_key(ctx, chain)


def _chain(expr) -> list[str] | None:
    """``args.amp`` → [args, amp]; ``cfg["train"]["amp"]`` → [cfg, train, amp]."""
    if isinstance(expr, ast.Name):
        return [expr.id]
    if isinstance(expr, ast.Attribute):
        head = _chain(expr.value)
        return None if head is None else [*head, expr.attr]
    if isinstance(expr, ast.Subscript):
        head = _chain(expr.value)
        key = expr.slice
        return [*head, key.value] if head is not None and isinstance(key, ast.Constant) \
            and isinstance(key.value, str) else None
    return None


def _ordered(ctx: AstContext, found: list[Flag] | list[ConfigKey]) -> list:
    """This file's own first, then by place."""
    root = ctx.project_root()
    here = project_name(Path(ctx.path).resolve(), root.resolve()) if root is not None else None
    return sorted(found, key=lambda f: (f.path != here, f.path, f.row))


def _place(ctx: AstContext, found: list[Flag] | list[ConfigKey], what: str) -> tuple[str, Related]:
    """How a finding names the first of ``found``: ``configs/base.yaml:12`` (and how many
    more), and as a related location."""
    first, root = found[0], ctx.project_root()
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    shown = relative_name((root / first.path).resolve(), Path.cwd())
    return f"{first.path}:{first.row}{more}", Related(shown, first.row, what)


def _flag(ctx: AstContext, chain: list[str]) -> Switch | None:
    flags = _ordered(ctx, list(ctx.flags_named(chain[-1])))
    if not flags:
        return None
    flag = flags[0]
    where, related = _place(ctx, flags, f"`{flag.option}` is defined here")
    state = "is set" if flag.store_true else "is true" + (f", default {flag.default}" if flag.default else "")
    return Switch(f"when `{flag.option}` {state} ({where})", (related,))


def _keys_read_by(ctx: AstContext, chain: list[str]) -> list[ConfigKey]:
    """The config keys whose path ends as ``chain`` does past its first name (the config
    object): all of it, or its last two names (`cfg.train.amp` and `train: {amp: true}`)."""
    wanted = chain[1:]
    need = min(len(wanted), 2)
    ending = tuple(wanted[-need:])
    return _ordered(ctx, [k for k in ctx.config_keys() if len(k.key) >= need and k.key[-need:] == ending])


def _config_key(ctx: AstContext, chain: list[str]) -> Switch | None:
    keys = _keys_read_by(ctx, chain)
    if not keys:
        return None
    key = keys[0]
    name = ".".join(key.key)
    where, related = _place(ctx, keys, f"`{name}: {key.value}`")
    if key.value.lower() in ("true", "yes", "on", "1"):
        return Switch(f"with `{name}: {key.value}` ({where})", (related,))
    return Switch(f"when `{name}` is true ({where} has `{key.value}`)", (related,))


def _parameter(ctx: AstContext, name: ast.Name) -> Switch | None:
    """The parameter ``name`` reads, not rebound before, and its default."""
    function = ctx.enclosing_function(name)
    if function is None or value_before(ctx, name) is not None:
        return None
    param, default = next(((p, d) for p, d in parameter_defaults(function.args).items() if p.arg == name.id),
                          (None, None))
    if param is None:
        return None
    return Switch(f"when `{name.id}` is true (a parameter of `{function.name}`, default `{ctx.code(default)}`)",
                  (Related(ctx.path, param.lineno, f"`{name.id}` defaults to `{ctx.code(default)}`"),))


def enabling_site(ctx: AstContext, float16: bool = False) -> tuple[AutocastSite, str, Related] | None:
    """The project's first autocast call or framework setting (``float16``: one that may run
    in float16), with how to name it in a message (``trainer.py:12 and 2 more``) and as a
    related location; None for a file in no project, or a project that enables none."""
    project = ctx.project()
    if not project:
        return None
    sites = [s for s in project[1] if s.may_be_float16()] if float16 else list(project[1])
    if not sites:
        return None
    return sites[0], site_named(ctx, sites[0], len(sites) - 1), site_related(sites[0])


def site_related(site: AutocastSite) -> Related:
    """The project's autocast site as a finding's related location."""
    return Related(site.shown_path(), site.row, f"autocast on ({site.setting})" if site.setting
                   else "autocast entered here")


def site_named(ctx: AstContext, site: AutocastSite, more: int) -> str:
    """How a message names the project's autocast site ``site`` (and ``more`` others): its place
    (``trainer.py:12``, a setting with its text), or for a setting a training script makes behind
    a switch, the switch ("when `--amp` is set (tools/train.py:20), as ... sets ...")."""
    named = setting_switch(ctx, site).when if switched_setting(site) else site.where(ctx.project_root())
    return named + (f" and {more} more" if more else "")
