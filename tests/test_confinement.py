"""OS confinement: detection, the refuse-or-warn policy, the sandbox's view, and its cost.

The tests that need a working bwrap are skipped, with the reason detection gave, on a machine
where it cannot create namespaces; the fallback tests force "not confined" and run everywhere.
"""

from __future__ import annotations

import ast
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from whale_lab import confine
from whale_lab.config import ConfigError, SandboxConfig, config_from_dict
from whale_lab.domains.interpreter import InterpreterLimits, PythonResult, run_python
from whale_lab.domains.tool_worker import ToolWorkers
from whale_lab.harness.host import HOST_ENTRY, HarnessHost

FIXTURES = Path(__file__).parent / "fixtures" / "harnesses"
CONF = confine.detect()
needs_bwrap = pytest.mark.skipif(
    not CONF.confined, reason=f"bwrap cannot confine on this machine: {CONF.reason}"
)
TOOL = InterpreterLimits(timeout_s=2.0, memory_mb=256, max_output_chars=2000)


def run_warm(code: str, limits: InterpreterLimits) -> PythonResult:
    """`code` through a warm tool worker (the math environment's path), closed afterwards."""
    pool = ToolWorkers(limits, spares=0)
    try:
        return pool.session().run(code)
    finally:
        pool.close()


RUNNERS = {"cold": run_python, "warm": run_warm}


@pytest.fixture
def unconfined(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pretend this machine cannot confine (as in a container without user namespaces)."""
    monkeypatch.setattr(
        confine, "_detected", confine.Confinement(False, reason="test: no user namespaces")
    )
    monkeypatch.setattr(confine, "_warned", False)
    yield


# ------------------------------------------------------------------ settings and policy


def test_allow_unconfined_is_a_validated_sandbox_setting() -> None:
    assert SandboxConfig().allow_unconfined is False
    cfg = config_from_dict({"sandbox": {"allow_unconfined": True}})
    assert cfg.sandbox.allow_unconfined is True
    with pytest.raises(ConfigError, match=r"sandbox\.allow_unconfined: expected true or false"):
        config_from_dict({"sandbox": {"allow_unconfined": "yes"}})


def test_unavailable_confinement_refuses_by_default_with_one_line(
    unconfined: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(confine.ALLOW_ENV, raising=False)
    with pytest.raises(confine.ConfinementError) as info:
        confine.enforce(False, "harness code")
    message = str(info.value)
    assert "\n" not in message
    assert "cannot be confined here" in message and "no user namespaces" in message
    assert "sandbox.allow_unconfined = true" in message  # says how to allow it
    assert confine.ALLOW_ENV in message
    with pytest.raises(confine.ConfinementError):
        HarnessHost(FIXTURES / "prompt_only.py", "math", SandboxConfig())
    with pytest.raises(confine.ConfinementError):
        run_python("print(1)", InterpreterLimits())
    with pytest.raises(confine.ConfinementError):
        run_warm("print(1)", InterpreterLimits())


def test_allowed_unconfined_falls_back_with_one_warning(
    unconfined: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(confine.ALLOW_ENV, raising=False)
    allowed = SandboxConfig(allow_unconfined=True)
    with HarnessHost(FIXTURES / "prompt_only.py", "math", allowed) as host:
        assert not host.confinement.confined
        assert host.parse(["hello"])[0].value == "hello"
    tool = InterpreterLimits(timeout_s=2.0, memory_mb=256, max_output_chars=2000,
                             allow_unconfined=True)
    for run in (run_python, run_warm):
        result = run("import sys\nprint('whale_lab' in sys.modules, len(sys.path) < 5)", tool)
        assert result.ok and result.stdout.strip() == "False True"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # once per process, however many hosts and tools start
    assert err[0].startswith("whale-lab: warning:") and "no user namespaces" in err[0]
    assert "resource limits only" in confine.detect().describe()


def test_the_environment_variable_allows_unconfined_for_one_command(
    unconfined: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(confine.ALLOW_ENV, "1")
    assert not confine.enforce(False, "tool code").confined
    monkeypatch.setenv(confine.ALLOW_ENV, "0")
    with pytest.raises(confine.ConfinementError):
        confine.enforce(False, "tool code")


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_tool_never_imports_whale_lab_nor_writes_bytecode(
    unconfined: None, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    monkeypatch.setenv(confine.ALLOW_ENV, "1")
    run = RUNNERS[runner]
    result = run("import whale_lab", TOOL)
    assert "No module named 'whale_lab'" in result.error
    result = run("import sys\nprint(sys.flags.dont_write_bytecode, sys.flags.no_site)", TOOL)
    assert result.stdout.strip() == "1 1"


# ------------------------------------------------------------------ building blocks


def test_exit_signal_reads_bwrap_and_popen_codes() -> None:
    assert confine.exit_signal(-9, False) == 9
    assert confine.exit_signal(137, True) == 9
    assert confine.exit_signal(137, False) is None
    assert confine.exit_signal(1, True) is None and confine.exit_signal(0, True) is None


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_is_well_formed(machine: str) -> None:
    prog = confine.seccomp_program(machine)
    assert prog is not None and len(prog) % 8 == 0
    instructions = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    assert len(instructions) < 64
    for pc, (code, jt, jf, _k) in enumerate(instructions):
        if code & 0x07 == 0x05:  # a jump stays inside the program
            assert pc + 1 + max(jt, jf) < len(instructions)
    assert instructions[-4][3] == 0x7FFF0000  # allow is the default for everything else
    assert confine.seccomp_program("sparc") is None


def test_the_host_view_holds_what_the_host_imports_and_no_data_or_domain_code() -> None:
    files = confine.module_closure(HOST_ENTRY)
    assert "harness/host_main.py" in files and "__init__.py" in files
    assert not any(f.startswith(("data/", "domains/")) for f in files)
    root = Path(confine.__file__).resolve().parent
    # what a fresh interpreter actually imports for the host is all in the view
    code = (
        f"import sys; sys.path.insert(0, {str(root.parent)!r}); import {HOST_ENTRY}; "
        "print('\\n'.join(m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('whale_lab') and getattr(m, '__file__', None)))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-s", "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    needed = {str(Path(p).resolve().relative_to(root)) for p in out}
    assert needed <= set(files), needed - set(files)
    binds = confine.package_binds(files)
    assert all(dst.startswith(confine.PACKAGE_ROOT + "/whale_lab/") for _, dst in binds)


def test_module_imports_follow_module_level_imports_only(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "import whale_lab.errors\n"
        "from whale_lab import config\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    import whale_lab.domains.math\n"
        "def f():\n    import whale_lab.domains.chess\n"
    )
    names = confine._module_imports(path, "whale_lab.harness.m", False)
    assert "whale_lab.errors" in names and "whale_lab.config" in names
    assert "whale_lab.harness.sibling" in names
    assert not any("domains" in n for n in names)


def test_a_missing_module_to_bind_is_a_clear_error() -> None:
    with pytest.raises(confine.ConfinementError, match=r"whale_lab/nope\.py: .*not found"):
        confine.package_binds(["nope.py"])


# ------------------------------------------------------------------ the real sandbox


@needs_bwrap
def test_detection_says_confined_and_names_bwrap() -> None:
    assert CONF.confined and os.path.isfile(CONF.bwrap)
    assert "bwrap" in CONF.describe() and "no network" in CONF.describe()


REPO = Path(__file__).resolve().parents[1]
VIEW = f"""
import os, socket, sys
print("root", sorted(os.listdir("/")))
print("etc", sorted(os.listdir("/etc")))
print("pid", os.getpid(), os.getppid())
print("net", sorted(n for _, n in socket.if_nameindex()))
print("proc", os.path.exists("/proc/1"))
print("repo", os.path.exists({str(REPO)!r}))
print("site", [p for p in sys.path if "site-packages" in p or "dist-packages" in p])
print("env", sorted(os.environ))
for path in ("/tmp/ok", "/usr/lib/planted", "/planted"):
    try:
        open(path, "w").write("x")
        print("wrote", path)
    except OSError as exc:
        print("refused", path, exc.errno)
"""


@needs_bwrap
@pytest.mark.parametrize("runner", RUNNERS)
def test_tool_code_sees_only_the_minimal_view(monkeypatch: pytest.MonkeyPatch, runner: str) -> None:
    monkeypatch.setenv("WHALE_LAB_TEST_SECRET", "s3cr3t")
    result = RUNNERS[runner](VIEW, TOOL)
    assert result.ok, result.error
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines()[:8])
    allowed = {"usr", "lib", "lib64", "lib32", "libx32", "etc", "dev", "tmp", "code"}
    allowed.add(Path(confine.python_executable()).parts[1])  # where the interpreter lives
    assert set(ast.literal_eval(lines["root"])) <= allowed
    assert ast.literal_eval(lines["etc"]) in ([], ["ld.so.cache"])
    assert lines["pid"] == "2 1"
    assert lines["net"] == "['lo']"
    assert lines["proc"] == "False" and lines["repo"] == "False"
    assert lines["site"] == "[]"
    assert "WHALE_LAB_TEST_SECRET" not in lines["env"] and "s3cr3t" not in result.stdout
    assert "wrote /tmp/ok" in result.stdout
    assert "refused /usr/lib/planted" in result.stdout and "refused /planted" in result.stdout


@needs_bwrap
def test_confined_host_reports_signals_through_bwrap() -> None:
    fast = SandboxConfig(call_timeout_s=0.5, memory_mb=300)
    with HarnessHost(FIXTURES / "misbehaving.py", "math", fast) as host:
        assert host.confinement.confined
        memory, after = host.parse(["memory", "after"])
        assert memory.kind == "memory" and after.value == "after"
