"""Opening run folders: a new run's first state, a resumed run's checked state and config."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.config import Config, ConfigError, config_from_dict
from whale_lab.engine.errors import EngineError
from whale_lab.engine.ledger import Ledger
from whale_lab.engine.schedules import PhaseSpec
from whale_lab.engine.state import ENGINE_VERSION, RunState
from whale_lab.seams import CommandChannel, Reviewer
from whale_lab.store import RunStore, atomic_write_json, read_json

if TYPE_CHECKING:
    from whale_lab.engine.engine import Engine
    from whale_lab.engine.probe import ProbeSettings


def load_or_new_state(cfg: Config, store: RunStore, plan: list[PhaseSpec]) -> RunState:
    """The folder's state when it has one (checked against this engine and plan), else a new one
    with the starting harness copied into the run folder."""
    root = store.root
    data = store.read_state()
    if data:
        if "engine_version" not in data:
            raise EngineError(
                f"{root} is not a run of the engine (its state.json was written by "
                "another command, e.g. `whale-lab train`); resume it with that command"
            )
        if int(data["engine_version"]) != ENGINE_VERSION:
            raise EngineError(
                f"{root}: state version {data['engine_version']} is not "
                f"{ENGINE_VERSION}; made by another whale-lab version"
            )
        saved_plan = [PhaseSpec(**p) for p in data.get("plan", [])]
        if saved_plan != plan:
            raise EngineError(
                f"{root}: the schedule in config.json gives another phase plan than the "
                "one this run started with; the run folder was edited"
            )
        return RunState.from_dict(data)
    from whale_lab.evaluate import default_harness_path

    src = default_harness_path(cfg)
    if not src.is_file():
        raise EngineError(f"domain.harness: harness file {src} not found")
    dst = root / "harnesses" / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        shutil.copyfile(src, dst)
    if not (root / "config.json").exists():
        atomic_write_json(root / "config.json", cfg.to_dict())
    try:
        rel = dst.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = str(dst)
    return RunState(
        engine_version=ENGINE_VERSION,
        run_id=store.run_id,
        schedule=cfg.schedule.kind,
        plan=[dataclasses.asdict(p) for p in plan],
        harness=rel,
        base_harness=rel,
        base_harness_source=str(src),
        ledger=Ledger().to_dict(),
    )


def from_cwd(path: str | Path) -> str:
    """`path` as a user would type it: relative to the working directory where it lies below
    it, else as it is."""
    if not str(path):
        return ""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (OSError, ValueError):
        return str(path)


def load_run_config(run_dir: str | Path) -> Config:
    """The config a run folder was started with (its `config.json`)."""
    root = Path(run_dir)
    if not root.is_dir():
        raise EngineError(f"run folder {root} not found")
    if (root / "search.json").exists():
        raise EngineError(
            f"{root} is a `whale-lab search` run; resume it with `whale-lab search --resume {root}`"
        )
    saved = read_json(root / "config.json", None)
    if not isinstance(saved, dict):
        raise EngineError(f"{root} is not a whale-lab run folder (no readable config.json)")
    try:
        return config_from_dict(saved)
    except ConfigError as exc:
        raise EngineError(f"{root / 'config.json'}: {exc}") from None


def _engine(cfg: Config, store: RunStore, **kw: Any) -> Engine:
    from whale_lab.engine.engine import Engine

    try:
        return Engine(cfg, store, **kw)
    except BaseException:
        store.close()
        raise


def open_engine(
    cfg: Config,
    run_dir: str | Path | None,
    *,
    reviewer: Reviewer,
    commands: CommandChannel,
    backend: Any = None,
    domain: Any = None,
    probe_settings: ProbeSettings | None = None,
) -> tuple[Engine, RunStore]:
    """A new run under `cfg.run.directory` (run_dir None), or the run in `run_dir` resumed.

    A resumed run keeps its own config.json; `cfg` only overrides the approval settings (who
    approves candidates may change between sessions, nothing else may).
    """
    if run_dir is None:
        store = RunStore.create(cfg.run.directory, cfg.run.name)
        atomic_write_json(store.root / "config.json", cfg.to_dict())
        run_cfg = cfg
    else:
        run_cfg = load_run_config(run_dir).replace(approval=cfg.approval)
        store = RunStore(run_dir)
    engine = _engine(
        run_cfg,
        store,
        reviewer=reviewer,
        commands=commands,
        backend=backend,
        domain=domain,
        probe_settings=probe_settings,
    )
    return engine, store


def create_run(
    cfg: Config,
    run_dir: str | Path,
    *,
    reviewer: Reviewer,
    commands: CommandChannel,
    backend: Any = None,
    domain: Any = None,
) -> tuple[Engine, RunStore]:
    """A run in a folder chosen by the caller (compare): new if it has no config.json yet."""
    root = Path(run_dir)
    if (root / "config.json").exists():
        return open_engine(
            cfg, root, reviewer=reviewer, commands=commands, backend=backend, domain=domain
        )
    store = RunStore(root)
    atomic_write_json(store.root / "config.json", cfg.to_dict())
    engine = _engine(
        cfg, store, reviewer=reviewer, commands=commands, backend=backend, domain=domain
    )
    return engine, store
