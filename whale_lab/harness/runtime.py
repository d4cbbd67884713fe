"""What runs inside the harness host: loading a harness file and calling its surfaces.

`HarnessRuntime` executes the module with restricted builtins, a guarded `__import__` that hands out
filtered views of allowed modules, and a static check first. It turns a task's fields, an episode
history and a context into chat messages (`render`) and a reply into a raw action (`parse`), using
the module's surfaces where defined and the defaults of `surfaces.py` otherwise. Functions are
called with only the keyword arguments their signature accepts, so `parse_action(response)` and
`format_observation(observation, **kw)` both work.

The host process (host_main.py) adds time, memory and output limits around every call.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import json
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import whale_lab.harness.ast_check as ast_check
from whale_lab.harness.surfaces import (
    ALLOWED_IMPORTS,
    MAX_TURNS_LIMIT,
    POSITIONAL_ARGS,
    RETRY_BUDGET_LIMIT,
    ROLES,
    STOP_SEQUENCES_LIMIT,
    SURFACES,
    fill_template,
)

MODULE_NAME = "harness"
# Modules the WHALE chess loader puts in a harness's globals without an import.
CHESS_PRELOADED = ("math", "random", "re")
MAX_MESSAGE_CHARS = 2000


class HarnessTimeout(BaseException):
    """Raised by the host's alarm when a call runs past its time limit."""


class OutputFlood(BaseException):
    """Raised when harness code writes far more output than the cap allows."""


class HarnessTypeError(Exception):
    """A surface returned a value of the wrong type (reported as kind "bad_type")."""


class MissingFunction(Exception):
    """`call` named a function the harness does not define (kind "missing")."""


class LoadFailure(Exception):
    """The module cannot be used: `line` (0 if none) and a readable `reason`."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


CONTROL_EXCEPTIONS = (HarnessTimeout, OutputFlood, MemoryError)


# ------------------------------------------------------------------ restricted module environment


class _ModuleViews:
    """Filtered copies of allowed modules: public names only, no foreign modules inside."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = frozenset(allowed)
        self.views: dict[str, types.ModuleType] = {}

    def view(self, name: str) -> types.ModuleType:
        if name in self.views:
            return self.views[name]
        real = sys.modules.get(name) or importlib.import_module(name)
        proxy = types.ModuleType(real.__name__, getattr(real, "__doc__", None))
        self.views[name] = proxy
        for key, value in list(vars(real).items()):
            if key.startswith("_") or key in ast_check.FORBIDDEN_ATTRS:
                continue
            if isinstance(value, types.ModuleType):
                if value.__name__ == f"{name}.{key}":
                    setattr(proxy, key, self.view(value.__name__))
                continue
            setattr(proxy, key, value)
        parent, _, last = name.rpartition(".")
        if parent:
            setattr(self.view(parent), last, proxy)
        return proxy

    def guarded_import(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,  # noqa: A002 - the __import__ signature
        locals: Mapping[str, Any] | None = None,  # noqa: A002
        fromlist: Iterable[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        if level:
            raise ImportError("relative imports are not allowed in harness code")
        root = name.partition(".")[0]
        if root not in self.allowed:
            raise ImportError(f"import of '{name}' is not allowed in harness code")
        importlib.import_module(name)
        if fromlist:
            proxy = self.view(name)
            for item in fromlist:
                if item == "*":
                    raise ImportError("'import *' is not allowed in harness code")
                if not hasattr(proxy, item) and not item.startswith("_"):
                    try:
                        importlib.import_module(f"{name}.{item}")
                    except ImportError:
                        continue
                    self.view(f"{name}.{item}")
            return proxy
        self.view(name)
        return self.view(root)


def _refuse_attr(name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError("attribute name must be a string")
    problem = ast_check.attr_problem(name)
    if problem:
        raise AttributeError(f"{problem} is not available to harness code")


def _safe_getattr(obj: Any, name: str, *default: Any) -> Any:
    _refuse_attr(name)
    return getattr(obj, name, *default)


def _safe_hasattr(obj: Any, name: str) -> bool:
    if not isinstance(name, str) or ast_check.attr_problem(name):
        return False
    return hasattr(obj, name)


def _safe_setattr(obj: Any, name: str, value: Any) -> None:
    _refuse_attr(name)
    setattr(obj, name, value)


def _safe_delattr(obj: Any, name: str) -> None:
    _refuse_attr(name)
    delattr(obj, name)


_SAFE_BUILTIN_NAMES = (
    "abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict dir divmod "
    "enumerate filter float format frozenset hash hex id int isinstance issubclass iter len list "
    "map max min next object oct ord pow print property range repr reversed round set slice "
    "sorted staticmethod str sum super tuple type zip NotImplemented Ellipsis __build_class__"
).split()


def safe_builtins(views: _ModuleViews) -> dict[str, Any]:
    """The builtins a harness sees: no eval/exec/compile/open/globals, guarded import/getattr."""
    out: dict[str, Any] = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES}
    for name, value in vars(builtins).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            out[name] = value
    out.update(
        __import__=views.guarded_import,
        getattr=_safe_getattr,
        hasattr=_safe_hasattr,
        setattr=_safe_setattr,
        delattr=_safe_delattr,
    )
    return out


# ------------------------------------------------------------------ helpers


def _where(exc: BaseException, path: str) -> tuple[int, str]:
    """The last line and function of the harness file in an exception's traceback."""
    line, func = 0, ""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == path:
            line, func = tb.tb_lineno, code.co_name
        tb = tb.tb_next
    return line, func


def _short(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def describe_exception(exc: BaseException, path: str) -> tuple[str, int]:
    """`ValueError: msg (at h.py:12 in parse_action)` and the harness line (0 when unknown)."""
    try:
        message = str(exc)
    except Exception:  # a harness exception whose __str__ itself fails
        message = "<unprintable message>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    line, func = _where(exc, path)
    if line:
        name = path.rsplit("/", 1)[-1]
        where = f"{name}:{line}" + (f" in {func}" if func and func != "<module>" else "")
        text = f"{_short(text)} (at {where})"
    return _short(text), line


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def check_json(value: Any, what: str) -> str:
    """The value as JSON text, or HarnessTypeError saying why it cannot cross the process boundary."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise HarnessTypeError(
            f"{what} returned a value that is not plain JSON data ({exc})"
        ) from None
    return text


class _Signature:
    """Which keyword arguments a function accepts, worked out once."""

    __slots__ = ("var_kw", "names", "positional", "positional_names")

    def __init__(self, fn: Callable[..., Any]) -> None:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            self.var_kw, self.names = False, frozenset()
            self.positional: int | None = None
            self.positional_names: list[str] = []
            return
        kinds = inspect.Parameter
        self.var_kw = any(p.kind == kinds.VAR_KEYWORD for p in params)
        self.names = frozenset(
            p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        )
        if any(p.kind == kinds.VAR_POSITIONAL for p in params):
            self.positional = None  # any number
        else:
            self.positional = sum(
                p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) for p in params
            )
        self.positional_names = [
            p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]

    def kwargs(self, n_positional: int, context: Mapping[str, Any]) -> dict[str, Any]:
        taken = set(self.positional_names[:n_positional])
        if self.var_kw:
            return {k: v for k, v in context.items() if k not in taken}
        return {k: v for k, v in context.items() if k in self.names and k not in taken}


# ------------------------------------------------------------------ the runtime


class HarnessRuntime:
    """A loaded harness module and the calls the engine makes on it."""

    def __init__(
        self,
        source: str,
        path: str,
        *,
        domain: str = "",
        allowed_imports: Iterable[str] = ALLOWED_IMPORTS,
        static_check: bool = True,
    ) -> None:
        self.path = path
        self.domain = domain
        self.allowed_imports = frozenset(allowed_imports)
        self._signatures: dict[Any, _Signature] = {}
        try:
            tree = ast_check.parse_source(source, path)
        except SyntaxError as exc:
            raise LoadFailure(exc.lineno or 0, f"syntax error: {exc.msg}") from None
        if static_check:
            problems = ast_check.check_tree(tree, self.allowed_imports)
            if problems:
                first = problems[0]
                more = (
                    f" (and {len(problems) - 1} more: "
                    + "; ".join(str(p) for p in problems[1:4])
                    + ")"
                    if len(problems) > 1
                    else ""
                )
                raise LoadFailure(first.line, first.message + more)
        self._lines = ast_check.definition_lines(tree)
        self._views = _ModuleViews(self.allowed_imports)
        # A real module object in sys.modules, so that library code that looks a class's module
        # up (dataclasses with string annotations) finds it.
        module = types.ModuleType(MODULE_NAME)
        namespace: dict[str, Any] = module.__dict__
        namespace["__builtins__"] = safe_builtins(self._views)
        sys.modules[MODULE_NAME] = module
        if domain == "chess":
            for name in CHESS_PRELOADED:
                if name in self.allowed_imports:
                    namespace[name] = self._views.guarded_import(name)
        try:
            code = compile(tree, path, "exec", dont_inherit=True)
            exec(code, namespace)
        except CONTROL_EXCEPTIONS:
            raise
        except BaseException as exc:  # the module's own failure, whatever it raised
            text, line = describe_exception(exc, path)
            raise LoadFailure(line, f"module raised {text}") from None
        self.ns = namespace
        self._check_surfaces()

    # -------------------------------------------------------------- loading checks

    def _fail(self, name: str, message: str) -> LoadFailure:
        return LoadFailure(self._lines.get(name, 0), message)

    def _check_surfaces(self) -> None:
        ns = self.ns
        for name, surface in SURFACES.items():
            if name not in ns:
                continue
            value = ns[name]
            if surface.kind == "str" and not isinstance(value, str):
                raise self._fail(name, f"{name} must be a str, got {_type_name(value)}")
            if surface.kind == "int":
                lo = 1 if name == "MAX_TURNS" else 0
                hi = MAX_TURNS_LIMIT if name == "MAX_TURNS" else RETRY_BUDGET_LIMIT
                if isinstance(value, bool) or not isinstance(value, int):
                    raise self._fail(
                        name, f"{name} must be an int >= {lo}, got {_type_name(value)} {value!r}"
                    )
                if not lo <= value <= hi:
                    raise self._fail(name, f"{name} must be an int in {lo}..{hi}, got {value}")
            if surface.kind == "str_tuple":
                if not isinstance(value, (tuple, list)) or not all(
                    isinstance(s, str) and s for s in value
                ):
                    raise self._fail(
                        name, f"{name} must be a tuple of non-empty str, got {value!r:.200}"
                    )
                if len(value) > STOP_SEQUENCES_LIMIT:
                    raise self._fail(
                        name, f"{name} may hold at most {STOP_SEQUENCES_LIMIT} strings"
                    )
            if surface.kind == "function":
                if not callable(value):
                    raise self._fail(name, f"{name} must be a function, got {_type_name(value)}")
                n = len(POSITIONAL_ARGS[name])
                sig = self._signature(value)
                if sig.positional is not None and sig.positional < n:
                    args = ", ".join(POSITIONAL_ARGS[name])
                    raise self._fail(
                        name, f"{name} must accept {n} positional argument(s) ({args})"
                    )

    def surface(self, name: str) -> Any:
        """The module's value for a surface, or its default."""
        if name in self.ns:
            return self.ns[name]
        return SURFACES[name].default

    def info(self) -> dict[str, Any]:
        """Effective settings plus the module's own constants and functions (JSON-ready)."""
        constants: dict[str, Any] = {}
        functions: list[str] = []
        for name, value in self.ns.items():
            if name.startswith("_"):
                continue
            if name.upper() == name and name[0].isalpha() and _is_constant(value):
                constants[name] = list(value) if isinstance(value, (tuple, list)) else value
            elif isinstance(value, types.FunctionType) and value.__module__ == MODULE_NAME:
                functions.append(name)
        return {
            "max_turns": self.surface("MAX_TURNS"),
            "format_retry_budget": self.surface("FORMAT_RETRY_BUDGET"),
            "illegal_move_retry_budget": self.surface("ILLEGAL_MOVE_RETRY_BUDGET"),
            "stop_sequences": list(self.surface("STOP_SEQUENCES")),
            "system_prompt": self.surface("SYSTEM_PROMPT"),
            "user_prompt": self.surface("USER_PROMPT"),
            "constants": constants,
            "functions": sorted(functions),
            "surfaces": sorted(name for name in SURFACES if name in self.ns),
        }

    # -------------------------------------------------------------- calls

    def _signature(self, fn: Callable[..., Any]) -> _Signature:
        sig = self._signatures.get(fn)
        if sig is None:
            sig = _Signature(fn)
            self._signatures[fn] = sig
        return sig

    def invoke(
        self, fn: Callable[..., Any], args: tuple[Any, ...], context: Mapping[str, Any]
    ) -> Any:
        """Call `fn(*args, **<the part of context its signature accepts>)`."""
        return fn(*args, **self._signature(fn).kwargs(len(args), context))

    def _text(self, name: str, args: tuple[Any, ...], context: Mapping[str, Any]) -> str:
        value = self.invoke(self.surface(name), args, context)
        if not isinstance(value, str):
            raise HarnessTypeError(f"{name} must return str, got {_type_name(value)}")
        return value

    def render(
        self,
        fields: Mapping[str, Any],
        history: list[Mapping[str, Any]],
        context: Mapping[str, Any],
    ) -> list[dict[str, str]]:
        """Chat messages for the next turn: system, first user, then the episode in order.

        The first observation fills `{observation}` in USER_PROMPT; later responses become
        assistant messages, later observations and feedback user messages. A history entry may
        carry its own "context" (merged over `context`) for the turn it belongs to.
        """
        base = dict(context)
        entries = list(history)
        messages: list[dict[str, str]] = []
        system = self.surface("SYSTEM_PROMPT")
        if system:
            messages.append({"role": "system", "content": system})
        first_obs = ""
        if entries and entries[0].get("type") == "observation":
            entry = entries.pop(0)
            obs = entry.get("observation")
            ctx = {**base, **entry.get("context", {})}
            first_obs = "" if obs is None else self._text("format_observation", (obs,), ctx)
        values = {**fields, "observation": first_obs}
        messages.append(
            {"role": "user", "content": fill_template(self.surface("USER_PROMPT"), values)}
        )
        for entry in entries:
            kind = entry.get("type")
            ctx = {**base, **entry.get("context", {})}
            if kind == "response":
                messages.append({"role": "assistant", "content": str(entry.get("text", ""))})
            elif kind == "feedback":
                text = self._text(
                    "format_feedback",
                    (str(entry.get("kind", "")), str(entry.get("detail", ""))),
                    ctx,
                )
                messages.append({"role": "user", "content": text})
            elif kind == "observation":
                obs = entry.get("observation")
                text = self._text("format_observation", (obs,), ctx)
                messages.append({"role": "user", "content": text})
            else:
                raise ValueError(f"unknown history entry type {kind!r}")
        selected = self.invoke(self.surface("select_context"), (messages,), base)
        return _check_messages(selected)

    def parse(self, response: str, context: Mapping[str, Any]) -> str | dict[str, Any] | None:
        """The raw action for one reply: str, dict or None."""
        value = self.invoke(self.surface("parse_action"), (response,), context)
        if value is not None and not isinstance(value, (str, dict)):
            raise HarnessTypeError(
                f"parse_action must return str, dict or None, got {_type_name(value)}"
            )
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise HarnessTypeError("parse_action returned a dict with non-str keys")
            check_json(value, "parse_action")
        return value

    def call(self, fn_name: str, item: Any) -> Any:
        """Call a module function by name; `item` is a kwargs dict or a list of positional args."""
        fn = self.ns.get(fn_name) if not fn_name.startswith("_") else None
        if fn is None and fn_name in SURFACES and SURFACES[fn_name].kind == "function":
            fn = SURFACES[fn_name].default
        if fn is None or not callable(fn):
            raise MissingFunction(f"the harness defines no function '{fn_name}'")
        if isinstance(item, Mapping):
            sig = self._signature(fn)
            return fn(**sig.kwargs(0, item))
        return fn(*list(item))


def _is_constant(value: Any) -> bool:
    scalar = (str, int, float, bool)
    if isinstance(value, scalar):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, scalar) for v in value)


def _check_messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise HarnessTypeError(
            f"select_context must return a list of messages, got {_type_name(value)}"
        )
    if not value:
        raise HarnessTypeError("render produced no messages")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise HarnessTypeError(
                f"message {i} must be a dict with role and content, got {_type_name(msg)}"
            )
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise HarnessTypeError(f"message {i} has role {role!r}; expected one of {ROLES}")
        if not isinstance(content, str):
            raise HarnessTypeError(f"message {i} content must be str, got {_type_name(content)}")
        out.append({"role": str(role), "content": str(content)})
    return out
