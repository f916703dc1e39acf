"""Which user tools a worker (or a device) runs: the modules `perdure worker --tools MODULE`
names, config.toml's `tool_modules = [...]`, and every entry point of the `perdure.tools`
group of the installed distributions (its value a module, one tool, or a list of them).

Loading imports each module (each `perdure.tool` declaration checks itself then), takes
every declaration at its top level, and checks them together: a name declared twice, a
compensation that names no loaded tool, or one that could not undo (it does not take
`perdure.Undo`, it is not a keyed or checked write, or it could not run on the devices its
tool may run on). Whatever is wrong is one line
naming the module or the tool (`ToolLoadError`): the worker does not start. Nothing here
runs a tool: what was loaded is a `Toolbox` (toolbox.py).
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.activities.tools.catalogue.tool_base import SAMPLE_KEY
from perdure.activities.tools.user.tool_decorator import ToolDeclaration, ToolDeclarationError, Undo
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.runtime.settings import config_path

ENTRY_POINT_GROUP = "perdure.tools"
CONFIG_KEY = "tool_modules"


class ToolLoadError(ValueError):
    """The user tools cannot be loaded; one line naming the module or tool and why."""


def load_toolbox(modules: Sequence[str] = (), *, with_entry_points: bool = True) -> Toolbox:
    """The tools of `modules` and (unless told not to) of the `perdure.tools` entry points,
    checked together; ToolLoadError says what is wrong."""
    found: dict[str, tuple[ToolDeclaration, str]] = {}
    sources: list[str] = []
    for module in dict.fromkeys(modules):
        _take(found, _declared_in(_imported(module), f"tool module {module}"), f"module {module}")
        sources.append(module)
    if with_entry_points:
        for point in entry_points(group=ENTRY_POINT_GROUP):
            where = f"entry point {point.name} = {point.value} ({_distribution(point)})"
            _take(found, _from_entry_point(point, where), where)
            sources.append(point.value)
    declarations = {name: declaration for name, (declaration, _) in found.items()}
    for declaration in declarations.values():
        problem = compensation_problem(declaration, declarations)
        if problem is not None:
            raise ToolLoadError(f"tool {declaration.name} ({found[declaration.name][1]}): {problem}")
    return Toolbox(declarations.values(), sources)


def configured_modules(path: Path | None = None) -> list[str]:
    """config.toml's `tool_modules`: the modules every worker started with it loads."""
    path = path or config_path()
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ToolLoadError(f"cannot read {CONFIG_KEY} from {path}: {err}") from None
    value = data.get(CONFIG_KEY, [])
    if not isinstance(value, list) or not all(isinstance(m, str) and m.strip() for m in value):
        raise ToolLoadError(f'{path}: {CONFIG_KEY} must be a list of module names, e.g. ["mypkg.tools"]')
    return [m.strip() for m in value]


def compensation_problem(declaration: ToolDeclaration, tools: dict[str, ToolDeclaration]) -> str | None:
    """Why this tool's compensation could not undo its effect, if it could not."""
    name = declaration.compensation
    if name is None:
        return None
    if name not in tools:
        where = "is a built-in tool, which does not take perdure.Undo" if name in TOOL_SPECS else "is not loaded"
        loaded = ", ".join(sorted(tools)) or "none"
        return f"its compensation names {name}, which {where} (tools loaded: {loaded})"
    undo = tools[name]
    if not undo.writes or undo.replay not in ("keyed", "check"):
        return (
            f"its compensation {name} is {undo.risk} with replay `{undo.replay}`: a compensation is a keyed or "
            "checked write, so a rollback interrupted and run again undoes once"
        )
    if declaration.devices and not undo.devices:
        return (
            f"is declared for devices but its compensation {name} is not: a rollback undoes an effect where it "
            f"was made, so declare {name} devices=True too"
        )
    sample = Undo(effect_key=SAMPLE_KEY, tool=declaration.name, args={})
    try:
        undo.args_model.model_validate(sample.model_dump(mode="json"))
    except ValidationError as err:
        return (
            f"its compensation {name} does not take perdure.Undo as its arguments "
            f"({undo.args_model.__name__}: {err.errors()[0]['msg']})"
        )
    return None


def _imported(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ToolDeclarationError as err:
        raise ToolLoadError(f"tool module {module}: {err}") from None
    except ModuleNotFoundError as err:
        missing = f"no module named {err.name}" if err.name else str(err)
        raise ToolLoadError(f"cannot import tool module {module}: {missing}") from None
    except SystemExit as err:
        raise ToolLoadError(f"tool module {module} exited while it was imported (SystemExit: {err.code})") from None
    except Exception as err:  # noqa: BLE001 - a user's module may fail anyhow: one line says how
        raise ToolLoadError(f"tool module {module} failed to import: {type(err).__name__}: {err}") from None


def _declared_in(module: ModuleType, where: str) -> list[ToolDeclaration]:
    declared = list({id(v): v for v in vars(module).values() if isinstance(v, ToolDeclaration)}.values())
    if not declared:
        raise ToolLoadError(f"{where} declares no tool (decorate a function with @perdure.tool)")
    return declared


def _from_entry_point(point: EntryPoint, where: str) -> list[ToolDeclaration]:
    try:
        value: Any = point.load()
    except ToolDeclarationError as err:
        raise ToolLoadError(f"{where}: {err}") from None
    except SystemExit as err:
        raise ToolLoadError(f"{where} exited while it was loaded (SystemExit: {err.code})") from None
    except Exception as err:  # noqa: BLE001 - an installed distribution may be broken anyhow
        raise ToolLoadError(f"{where} failed to load: {type(err).__name__}: {err}") from None
    if isinstance(value, ModuleType):
        return _declared_in(value, where)
    if isinstance(value, ToolDeclaration):
        return [value]
    if isinstance(value, list | tuple) and value and all(isinstance(v, ToolDeclaration) for v in value):
        return list(value)
    raise ToolLoadError(f"{where} is neither a module of tools, a tool, nor a list of tools")


def _take(found: dict[str, tuple[ToolDeclaration, str]], declarations: list[ToolDeclaration], where: str) -> None:
    for declaration in declarations:
        earlier = found.get(declaration.name)
        if earlier is not None and earlier[0] is not declaration:
            raise ToolLoadError(f"tool {declaration.name} is declared twice: in {earlier[1]} and in {where}")
        found.setdefault(declaration.name, (declaration, where))


def _distribution(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"distribution {dist.name}" if dist is not None else "an installed distribution"
