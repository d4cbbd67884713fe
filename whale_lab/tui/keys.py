"""Key bindings with stable ids, and a user keymap (TOML) that remaps them by id.

A keymap file looks like:

    [keys]
    "review.approve" = "y"
    "control.pause" = "space"

`WHALE_LAB_KEYMAP` names the file; otherwise `~/.config/whale-lab/keymap.toml` is read if present.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from textual.binding import Binding

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APP_BINDINGS: list[Binding] = [
    Binding("q", "quit", "Quit", id="app.quit"),
    Binding("question_mark,f1", "help", "Help", id="app.help", key_display="?"),
    Binding("1", "show_tab('rollouts')", "Rollouts", show=False, id="tab.rollouts"),
    Binding("2", "show_tab('accuracy')", "Accuracy", show=False, id="tab.accuracy"),
    Binding("3", "show_tab('review')", "Review", show=False, id="tab.review"),
    Binding("4", "show_tab('control')", "Control", show=False, id="tab.control"),
    Binding("5", "show_tab('log')", "Log", show=False, id="tab.log"),
    # phase control: usable from every tab; the Control tab shows them as buttons
    Binding("p", "pause", "Pause", id="control.pause"),
    Binding("g", "resume", "Resume", id="control.resume"),
    Binding("s", "switch", "Switch phase", show=False, id="control.switch"),
    Binding("b", "probe", "Probe", show=False, id="control.probe"),
    Binding("x", "stop", "Stop", show=False, id="control.stop"),
    # review queue: on the Review tab
    Binding("a", "approve", "Approve", id="review.approve"),
    Binding("r", "reject", "Reject", id="review.reject"),
    Binding("e", "edit", "Edit+approve", id="review.edit"),
    Binding("P", "pin", "Pin", id="review.pin"),
    Binding("t", "transcript", "Transcript", id="review.transcript"),
    Binding("n", "steer", "Steer note", id="review.steer"),
    # rollouts: on the Rollouts tab
    Binding("f", "filter(1)", "Filter", id="rollouts.filter"),
    Binding("F", "filter(-1)", "Filter back", show=False, id="rollouts.filter_back"),
    Binding("o", "open_trace", "Trace", id="rollouts.open"),
]

BINDING_IDS = tuple(b.id for b in APP_BINDINGS if b.id)


class KeymapError(ValueError):
    """A keymap file problem: names the file, the binding id and what is wrong."""


def default_keymap_path() -> Path | None:
    env = os.environ.get("WHALE_LAB_KEYMAP")
    if env:
        return Path(env)
    path = Path.home() / ".config" / "whale-lab" / "keymap.toml"
    return path if path.exists() else None


def load_keymap(path: str | Path | None) -> dict[str, str]:
    """Read `[keys]` from a TOML file; unknown ids or non-string keys raise `KeymapError`."""
    if path is None:
        return {}
    p = Path(path)
    if not p.exists():
        raise KeymapError(f"{p}: keymap file not found")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise KeymapError(f"{p}: not valid TOML: {exc}") from None
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise KeymapError(f'{p}: [keys] must be a table of binding id = "key"')
    return validate_keymap(keys, source=str(p))


def validate_keymap(keys: dict[str, object], source: str = "keymap") -> dict[str, str]:
    out: dict[str, str] = {}
    for binding_id, key in keys.items():
        if binding_id not in BINDING_IDS:
            close = difflib.get_close_matches(binding_id, BINDING_IDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeymapError(
                f"{source}: keys.{binding_id}: unknown binding id{hint}; "
                f"valid ids: {', '.join(BINDING_IDS)}"
            )
        if not isinstance(key, str) or not key.strip():
            raise KeymapError(
                f"{source}: keys.{binding_id}: expected a key name string, got {key!r}"
            )
        out[binding_id] = key.strip()
    return out


def effective_keys(keymap: dict[str, str]) -> dict[str, str]:
    """Binding id -> the key(s) shown to the user, after the keymap."""
    out: dict[str, str] = {}
    for b in APP_BINDINGS:
        if not b.id:
            continue
        key = keymap.get(b.id) or (b.key_display or b.key)
        out[b.id] = key
    return out
