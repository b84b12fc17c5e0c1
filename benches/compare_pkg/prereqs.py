"""What a run needs on the machine, and what it builds before it starts.

It needs the Debian packages wrk, golang-go, nginx, nodejs and util-linux
(taskset), nghttp2-client for --tool h2load, varnish when a planned variant
needs it (slow-upstream-cached's, see Variant.programs), and python3-venv where the
running Python has no ensurepip; a venv at target/bench-venv with the pinned
packages of benches/peers/python/requirements.txt (when a planned variant is
a Python peer; reinstalled when that file changes); and oha (`cargo install oha --locked`)
for --tool oha.

It installs none of these by itself, the venv included (it downloads from
PyPI): when any is missing it prints what, with the exact commands that
install it, and exits with status 3 before anything is built or started.
With --install it runs those same commands itself, apt-get through sudo when
not root, as benches/compare always did before the flag existed.

What it always does, being the project's own code: builds the Go peers
(`go build`), the gateway and the floor (`cargo build --release`, unless
--no-build), and writes the 1 KiB demo file.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

from .common import (
    DEMO_FILE,
    GATEWAY_BIN,
    GO_BIN,
    PEERS,
    ROOT,
    TARGET,
    VENV,
    VENV_PYTHON,
    find_program,
    run_checked,
)

# Program looked for on PATH -> the Debian package that has it.
DEBIAN_PACKAGES = {"wrk": "wrk", "go": "golang-go", "nginx": "nginx", "node": "nodejs", "taskset": "util-linux"}
TOOL_PACKAGES = {"h2load": "nghttp2-client"}
REQUIREMENTS = PEERS / "python" / "requirements.txt"
# A copy of the requirements the venv was last installed from.
VENV_STAMP = VENV / "installed-requirements.txt"
# The exit status when something is missing and --install was not given
# (1 is a failed variant, 2 a bad command line).
EXIT_MISSING = 3


@dataclass
class Need:
    """Something missing, and the commands that install it, in order."""

    what: str
    commands: list
    env: dict = field(default_factory=dict)


def missing_debian_packages(tool, extra=None, python=True):
    """{program: Debian package} of what is not on PATH; extra: what the
    planned variants need beyond DEBIAN_PACKAGES (Variant.programs)."""
    wanted = {**DEBIAN_PACKAGES, **(extra or {})}
    if tool in TOOL_PACKAGES:
        wanted[tool] = TOOL_PACKAGES[tool]
    missing = {cmd: pkg for cmd, pkg in wanted.items() if not find_program(cmd)}
    if python and importlib.util.find_spec("ensurepip") is None:
        # Debian's python3 makes venvs only with python3-venv.
        missing["ensurepip"] = "python3-venv"
    return missing


def debian_need(missing):
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    packages = sorted(set(missing.values()))
    install = [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    what = ", ".join(f"{cmd} (Debian package {pkg})" for cmd, pkg in missing.items())
    return Need(what, [[*sudo, "apt-get", "update", "-q"], install], {"DEBIAN_FRONTEND": "noninteractive"})


def venv_need():
    """None when the venv was installed from the current requirements."""
    if VENV_STAMP.exists() and VENV_STAMP.read_text() == REQUIREMENTS.read_text():
        return None
    create = [] if VENV_PYTHON.exists() else [[sys.executable, "-m", "venv", VENV]]
    pip = [VENV_PYTHON, "-m", "pip", "install", "-q", "-r", REQUIREMENTS]
    what = f"the Python peers' venv {short_path(VENV)}, with {short_path(REQUIREMENTS)}"
    return Need(what, [*create, pip, ["cp", REQUIREMENTS, VENV_STAMP]])


def needs(tool, extra=None, python=True):
    """What the run needs and does not have, in the order it is installed;
    python: whether a planned variant runs in the venv."""
    found = []
    packages = missing_debian_packages(tool, extra, python)
    if packages:
        found.append(debian_need(packages))
    venv = venv_need() if python else None
    if venv:
        found.append(venv)
    if tool == "oha" and not find_program("oha"):
        found.append(Need("oha (for --tool oha)", [["cargo", "install", "oha", "--locked"]]))
    return found


def short_path(path):
    """A path under the repository as relative to it, as the commands are shown."""
    text = str(path)
    return text[len(str(ROOT)) + 1 :] if text.startswith(str(ROOT) + "/") else text


def install_or_report(tool, install, extra=None, python=True):
    """Installs what is missing with --install; without it, says what is
    missing and how to install it, and exits with EXIT_MISSING. extra:
    {program: Debian package} the planned variants need (varnish); python:
    whether any of them runs in the Python peers' venv (without one, the
    venv is not needed)."""
    missing = needs(tool, extra, python)
    if install:
        for need in missing:
            for argv in need.commands:
                run_checked(argv, env={**os.environ, **need.env} if need.env else None)
        return
    if not missing:
        return
    lines = [
        "benches/compare: missing what the run needs, and nothing was installed or run.",
        f"Install it with these commands (from {ROOT}), or run again with --install to have them run:",
    ]
    for need in missing:
        lines.append(f"  {need.what}:")
        lines.extend("    " + shlex.join(short_path(a) for a in argv) for argv in need.commands)
    print("\n".join(lines), file=sys.stderr, flush=True)
    sys.exit(EXIT_MISSING)


def set_up(args):
    """Builds what the run needs (after install_or_report); returns the
    gateway's problem, if any."""
    build_go_peers()
    write_demo_file()
    return build_gateway(args.no_build)


def build_go_peers():
    GO_BIN.parent.mkdir(parents=True, exist_ok=True)
    run_checked([find_program("go"), "build", "-o", GO_BIN, "."], cwd=PEERS / "go")


def build_gateway(skip):
    """Returns None when target/release/gateway is ready, else why not."""
    if not skip:
        try:
            run_checked(["cargo", "build", "--release"], cwd=ROOT)
        except subprocess.CalledProcessError as err:
            return f"cargo build --release failed ({err.returncode})"
        # Its own package and target dir: built as an example of the
        # gateway's, it would switch on the dev-dependencies' features
        # (tokio's test-util) for the gateway built beside it.
        floor = ["cargo", "build", "--release", "--manifest-path", "benches/floor/Cargo.toml", "--target-dir"]
        run_checked([*floor, TARGET / "floor"], cwd=ROOT)
    return None if GATEWAY_BIN.exists() else f"{GATEWAY_BIN} not found"


def gateway_has_upstream():
    try:
        done = subprocess.run([GATEWAY_BIN, "upstream", "--help"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and b"--delay" in done.stdout


def write_demo_file():
    """A 1 KiB text file, the same bytes every run."""
    DEMO_FILE.parent.mkdir(parents=True, exist_ok=True)
    line = "The quick brown fox jumps over the lazy dog. 0123456789\n"
    text = (line * (1024 // len(line) + 1))[:1023] + "\n"
    DEMO_FILE.write_text(text)
