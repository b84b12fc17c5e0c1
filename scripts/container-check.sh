#!/usr/bin/env bash
# Container image check: builds the image from the Dockerfile as it is, then
# starts it and checks it from outside.
#
#   bash scripts/container-check.sh [UPSTREAM_BIN]
#
# UPSTREAM_BIN runs `gateway upstream` on the host (default: the gateway binary
# copied out of the image just built).
#
# 1. Tools: Debian's podman, buildah and debootstrap, installed if missing.
# 2. Base images (the Dockerfile's FROM lines): used as they are if local
#    storage has them; else pulled (bounded by CONTAINER_CHECK_PULL_TIMEOUT);
#    else, for debian:bookworm-slim and rust:1-slim-bookworm, assembled here:
#    `debootstrap --variant=minbase bookworm` from the mirror apt already uses,
#    slimmed the way the official -slim images are, imported as
#    debian:bookworm-slim; the same root filesystem plus gcc, libc6-dev,
#    ca-certificates and this machine's rustup toolchain (and its CA bundle,
#    $SSL_CERT_FILE, for TLS-inspecting proxies), imported as
#    rust:1-slim-bookworm. The assembled Rust image is labelled with the
#    toolchain's version and assembled again when that changes.
# 3. Build: buildah bud --isolation chroot --pull=never -t $IMAGE .
# 4. Image: USER, ENTRYPOINT, CMD, ENV and EXPOSE equal the Dockerfile's final
#    stage; the user is not root and is the pod's runAsUser in
#    deploy/kubernetes/deployment.yaml; the image size.
# 5. Run (buildah run --isolation chroot; the container shares the host's
#    network, as a pod's containers share theirs): `gateway check` on the
#    image's config; the image's own default command answers /healthz,
#    /readyz, /metrics and /file with 200 and proxies the config's proxy route
#    to `gateway upstream` on the host at the address the config names
#    (127.0.0.1:8000, the sidecar layout); it runs as the image's user, inside
#    the image's root; SIGTERM stops it with status 0.
# Every process it starts is stopped on exit, its working container removed.
#
# Environment: CONTAINER_CHECK_IMAGE (tag to build, default gateway:ci),
# CONTAINER_CHECK_PULL_TIMEOUT (seconds per base image pull, default 60; 0
# skips pulling), CONTAINER_CHECK_REASSEMBLE=1 (assemble the base images again
# even if present), DEBIAN_MIRROR (default: the one apt uses).
#
# Needs root: debootstrap, chroot, and buildah's chroot isolation. `podman run`
# is not used: it needs cgroups that some machines (hybrid cgroup v1/v2) lack.
#
# What CI does with it, and what it measured:
#
# CI (`.ci/run`) builds the image from the Dockerfile as it is and runs it:
# `sudo bash scripts/container-check.sh [UPSTREAM_BIN]` (root: it uses
# debootstrap, chroot and buildah's chroot isolation). It installs podman,
# buildah and debootstrap if missing; takes the base images from local
# storage, else pulls them (60 s bound), else assembles them (`debootstrap
# --variant=minbase bookworm` from apt's mirror, slimmed, as
# `debian:bookworm-slim`; the same plus gcc, libc6-dev, ca-certificates and
# this machine's rustup toolchain as `rust:1-slim-bookworm`; kept for later
# runs); builds with `buildah bud --isolation chroot --pull=never -t
# gateway:ci .`; checks that the image's USER, ENTRYPOINT, CMD, ENV and EXPOSE
# are the Dockerfile's, that the user is not root and is the pod's
# `runAsUser`, and that `gateway check` passes inside it; then starts the
# image's own default command with `buildah run` (sharing the host's network)
# and checks `/healthz`, `/readyz`, `/metrics` and `/file` answer 200, `/b` is
# proxied to a `gateway upstream` on the host's 127.0.0.1:8000, the process
# runs as UID 10001 inside the image's root, and SIGTERM ends it with status
# 0. Port 8000 must be free (the config names it): if it is taken the check
# fails and names the holder. If 8080 is taken, that run's gateway listens on
# a free port instead (`GATEWAY__SERVER__LISTEN` set in the working container,
# not the image) and says so.
#
# Size: 99.2 MB (`podman image inspect --format '{{.Size}}' gateway:ci` →
# 99239172 bytes): the debian:bookworm-slim base, 77.1 MB as assembled by
# `scripts/container-check.sh` (the official image was not reachable from the
# machine that measured this), plus the 22.1 MB binary. The release profile
# keeps line tables for backtraces; `strip --strip-debug` would make the
# binary 5.2 MB.
#
# Measured on a 2-core Debian VM, `.ci/run` in a fresh worktree with other
# cargo builds running on the machine (load average 3.4 at the start), podman,
# buildah and debootstrap already installed (installing them took 16 s): the
# first run of the check took 148 s (assembling the two base images 51 s, the
# image build 96 s, of which `cargo build --release` 1 min 34 s) and the whole
# `.ci/run` 5 min 18 s (`time .ci/run`). Later runs of the check take 3 s
# (`time bash scripts/container-check.sh`): the base images and buildah's
# cargo cache mounts are kept.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

IMAGE=${CONTAINER_CHECK_IMAGE:-gateway:ci}
UPSTREAM_BIN=${1:-}
PULL_TIMEOUT=${CONTAINER_CHECK_PULL_TIMEOUT:-60}
REASSEMBLE=${CONTAINER_CHECK_REASSEMBLE:-0}
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
RUST_IMAGE=docker.io/library/rust:1-slim-bookworm
ASSEMBLED_LABEL=gateway-ci.assembled
K8S_DEPLOYMENT=deploy/kubernetes/deployment.yaml

START=$SECONDS
log() { printf '\n==> [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
die() {
    printf 'container-check: FAILED: %s\n' "$*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, buildah --isolation chroot); run it with sudo"

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/container-check.XXXXXX")
# A containers.conf may set default_ulimits that setrlimit refuses where the
# hard limits are lower (here `podman run` failed on its default
# RLIMIT_NOFILE); buildah's chroot isolation applies them too. None are needed.
printf '[containers]\ndefault_ulimits = []\n' >"$WORK/containers.conf"
export CONTAINERS_CONF=$WORK/containers.conf

# --- clean-up -----------------------------------------------------------------

PIDS=()  # processes started here
PGIDS=() # process groups started here (buildah run and its children)
CTR=""

stop_pid() {
    local pid=$1
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

stop_group() {
    local pgid=$1
    kill -TERM -- "-$pgid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        kill -0 -- "-$pgid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pgid" 2>/dev/null || true
    wait "$pgid" 2>/dev/null || true
}

cleanup() {
    local rc=$? id f
    for id in ${PGIDS[@]+"${PGIDS[@]}"}; do stop_group "$id"; done
    for id in ${PIDS[@]+"${PIDS[@]}"}; do stop_pid "$id"; done
    if [ -n "$CTR" ]; then
        buildah umount "$CTR" >/dev/null 2>&1 || true
        buildah rm "$CTR" >/dev/null 2>&1 || true
    fi
    if [ "$rc" -ne 0 ]; then
        for f in "$WORK"/*.log; do
            [ -s "$f" ] || continue
            echo "--- last lines of $(basename "$f")" >&2
            tail -n 25 "$f" >&2
        done
    fi
    # Nothing is mounted under $WORK (the chroot steps mount nothing).
    rm -rf "$WORK"
    if [ "$rc" -eq 0 ]; then
        echo "container-check: all passed in $((SECONDS - START))s"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. tools -----------------------------------------------------------------

log "tools"
missing=()
for pair in podman:podman buildah:buildah debootstrap:debootstrap curl:curl ss:iproute2; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$WORK/apt.log" 2>&1 ||
        die "apt-get install ${missing[*]} failed"
    rm -f "$WORK/apt.log"
fi
podman --version
buildah --version

# --- 2. base images -----------------------------------------------------------

# The first Debian archive URI apt uses (one-line and deb822 sources).
debian_mirror() {
    python3 - <<'PY'
import glob, re
uris = []
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        text = open(path).read()
    except OSError:
        continue
    for line in text.splitlines():
        m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
        if m:
            uris.append(m.group(1))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for block in re.split(r"\n\s*\n", open(path).read()):
        fields = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.split()
        if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"])[0] != "no":
            uris += fields.get("uris", [])
debian = [u for u in uris if re.search(r"/debian(/\d{8}T\d{6}Z)?/?$", u)]
print(debian[0] if debian else "http://deb.debian.org/debian")
PY
}

# Drop what the official -slim images leave out, now and for later installs.
slim_rootfs() {
    local r=$1
    mkdir -p "$r/etc/dpkg/dpkg.cfg.d"
    cat >"$r/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
    find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$r"/usr/share/{groff,info,linda,locale,man}/* "$r"/usr/share/lintian/overrides/* \
        "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb \
        "$r"/var/log/apt/* "$r"/var/log/*.log "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
    # The runtime supplies these; don't ship this machine's.
    : >"$r/etc/resolv.conf"
    echo localhost >"$r/etc/hostname"
}

image_label() { podman image inspect --format "{{ index .Labels \"$ASSEMBLED_LABEL\" }}" "$1" 2>/dev/null || true; }
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

# retire_image ID: remove an image a tag named before it was rebuilt, if no
# tag names it now (and no container uses it).
retire_image() {
    [ -n "$1" ] && [ "$(podman image inspect --format '{{len .RepoTags}}' "$1" 2>/dev/null)" = 0 ] || return 0
    podman rmi "$1" >/dev/null 2>&1 || true
}

ROOTFS=""
debootstrap_rootfs() {
    [ -z "$ROOTFS" ] || return 0
    local mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
    ROOTFS=$WORK/rootfs
    log "debootstrap --variant=minbase bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$ROOTFS" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
        die "debootstrap from $mirror failed"
    rm -f "$WORK/debootstrap.log"
    slim_rootfs "$ROOTFS"
}

assemble_debian() {
    debootstrap_rootfs
    log "importing the root filesystem ($(du -sh "$ROOTFS" | cut -f1)) as $DEBIAN_IMAGE"
    tar -C "$ROOTFS" -c . | podman import -q \
        --change "LABEL $ASSEMBLED_LABEL=\"debootstrap minbase bookworm\"" \
        --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null
}

assemble_rust() {
    command -v rustup >/dev/null || die "assembling $RUST_IMAGE needs a rustup-managed Rust toolchain on this machine"
    local version sysroot toolchain r tc b
    version=$(rustc --version)
    sysroot=$(rustc --print sysroot)
    toolchain=$(basename "$sysroot")
    [ -x "$sysroot/bin/cargo" ] || die "toolchain $sysroot has no cargo"
    debootstrap_rootfs
    r=$WORK/rust-rootfs
    cp -a "$ROOTFS" "$r"
    log "adding gcc, libc6-dev, ca-certificates (chroot apt-get) and $version"
    cp /etc/resolv.conf "$r/etc/resolv.conf"
    {
        chroot "$r" apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive chroot "$r" apt-get install -y -qq --no-install-recommends \
                gcc libc6-dev ca-certificates
    } >"$WORK/rust-apt.log" 2>&1 || die "chroot apt-get install gcc libc6-dev ca-certificates failed"
    rm -f "$WORK/rust-apt.log"
    if [ -n "${SSL_CERT_FILE:-}" ] && [ -r "$SSL_CERT_FILE" ]; then
        # So cargo in the build trusts what this machine trusts (a TLS-inspecting
        # proxy's CA). Baked into this local stand-in rather than bind-mounted
        # at build time: buildah leaves a bind mount's target behind in every
        # stage, and the runtime image would ship an empty CA file.
        cat "$SSL_CERT_FILE" >>"$r/etc/ssl/certs/ca-certificates.crt"
    fi
    tc=$r/usr/local/rustup/toolchains/$toolchain
    mkdir -p "$tc" "$r/usr/local/cargo/bin"
    tar -C "$sysroot" --exclude=./share/doc -c . | tar -C "$tc" -x
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$toolchain" >"$r/usr/local/rustup/settings.toml"
    install -m 0755 "$(readlink -f "$(command -v rustup)")" "$r/usr/local/cargo/bin/rustup"
    for b in cargo rustc rustdoc; do ln -s rustup "$r/usr/local/cargo/bin/$b"; done
    slim_rootfs "$r"
    log "importing the root filesystem ($(du -sh "$r" | cut -f1)) as $RUST_IMAGE"
    tar -C "$r" -c . | podman import -q \
        --change "LABEL $ASSEMBLED_LABEL=\"$version\"" \
        --change 'ENV RUSTUP_HOME=/usr/local/rustup' \
        --change 'ENV CARGO_HOME=/usr/local/cargo' \
        --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change "ENV RUST_VERSION=$(awk '{print $2}' <<<"$version")" \
        --change 'CMD ["bash"]' - "$RUST_IMAGE" >/dev/null
    rm -rf "$r"
}

# ensure_base NAME: the image the Dockerfile names, from local storage, a
# registry, or assembled here.
ensure_base() {
    local name=$1 full label old_id
    case "$name" in
        debian:bookworm-slim | docker.io/library/debian:bookworm-slim) full=$DEBIAN_IMAGE ;;
        rust:1-slim-bookworm | docker.io/library/rust:1-slim-bookworm) full=$RUST_IMAGE ;;
        *) full=$name ;;
    esac
    if podman image exists "$full" && [ "$REASSEMBLE" != 1 ]; then
        label=$(image_label "$full")
        if [ "$full" = "$RUST_IMAGE" ] && [ -n "$label" ] && [ "$label" != "$(rustc --version)" ]; then
            echo "$full: assembled with $label, this machine has $(rustc --version): assembling again"
        else
            echo "$full: in local storage${label:+ (assembled here: $label)}"
            return 0
        fi
    elif [ "$PULL_TIMEOUT" -gt 0 ] && [ "$REASSEMBLE" != 1 ]; then
        log "pulling $full (at most ${PULL_TIMEOUT}s)"
        local prc=0
        timeout "$PULL_TIMEOUT" podman pull -q "$full" >"$WORK/pull.log" 2>&1 || prc=$?
        if [ "$prc" -eq 0 ]; then
            echo "$full: pulled"
            return 0
        fi
        [ "$prc" -ne 124 ] || echo "pull timed out after ${PULL_TIMEOUT}s" >>"$WORK/pull.log"
        echo "$full: not pulled ($(tail -n 1 "$WORK/pull.log" | cut -c1-200)); assembling it here"
        rm -f "$WORK/pull.log"
    fi
    old_id=$(image_id "$full")
    case "$full" in
        "$DEBIAN_IMAGE") assemble_debian ;;
        "$RUST_IMAGE") assemble_rust ;;
        *) die "the Dockerfile needs $name: not in local storage, could not be pulled, and this script cannot assemble it" ;;
    esac
    podman image exists "$full" || die "assembling $full did not produce the image"
    retire_image "$old_id"
    echo "$full: assembled here ($(image_label "$full"))"
}

log "base images"
mapfile -t BASES < <(awk 'toupper($1) == "FROM" { for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; break } }' Dockerfile | sort -u)
[ ${#BASES[@]} -gt 0 ] || die "no FROM line in Dockerfile"
for base in "${BASES[@]}"; do
    # A FROM naming an earlier stage is not an image.
    if grep -qiE "^FROM .* AS $base\$" Dockerfile; then continue; fi
    ensure_base "$base"
done

# --- 3. build -----------------------------------------------------------------

log "building $IMAGE from the Dockerfile (buildah bud --isolation chroot --pull=never)"
old_id=$(image_id "$IMAGE")
build_start=$SECONDS
buildah bud --isolation chroot --pull=never --iidfile "$WORK/iid" -t "$IMAGE" . >"$WORK/build.log" 2>&1 ||
    die "buildah bud failed (build.log below)"
BUILD_SECONDS=$((SECONDS - build_start))
grep -E '^\[[0-9]+/[0-9]+\] STEP|Finished|^warning|warning:' "$WORK/build.log" || true
rm -f "$WORK/build.log"
IMG_ID=$(cat "$WORK/iid")
IMG_ID=${IMG_ID#sha256:}
echo "built $IMAGE (${IMG_ID:0:12}) in ${BUILD_SECONDS}s"
retire_image "$old_id"

# --- 4. image -----------------------------------------------------------------

log "image configuration vs the Dockerfile"
podman image inspect "$IMG_ID" >"$WORK/inspect.json"
CTR=$(buildah from --pull-never --name "gateway-ci-$$" "$IMG_ID")
MNT=$(buildah mount "$CTR")
# Prints ok/FAIL lines; writes the default command (NUL-separated), the user's
# uid:gid, the listen port and the image size for the steps below.
python3 - Dockerfile "$WORK/inspect.json" "$K8S_DEPLOYMENT" "$MNT" "$WORK" <<'PY' || die "image checks failed (FAIL lines above)"
import json, re, shlex, sys
dockerfile, inspect_path, deployment, mnt, work = sys.argv[1:]

# The final stage's instructions, continuation lines joined, comments dropped.
lines, cur = [], ""
for raw in open(dockerfile):
    s = raw.rstrip("\n")
    if not cur and (not s.strip() or s.lstrip().startswith("#")):
        continue
    if s.endswith("\\"):
        cur += s[:-1] + " "
        continue
    lines.append((cur + s).strip())
    cur = ""
stage = []
for line in lines:
    word = line.split(None, 1)[0].upper()
    if word == "FROM":
        stage = []
    stage.append((word, line.split(None, 1)[1] if " " in line else ""))

def form(arg):  # exec form (JSON) or shell form
    try:
        v = json.loads(arg)
        if isinstance(v, list):
            return v
    except ValueError:
        pass
    return ["/bin/sh", "-c", arg]

want = {"User": "", "Entrypoint": None, "Cmd": None, "Env": {}, "ExposedPorts": set()}
entry_set = cmd_set = False
for word, arg in stage:
    if word == "USER":
        want["User"] = arg.strip()
    elif word == "ENTRYPOINT":
        want["Entrypoint"], entry_set = form(arg), True
        if not cmd_set:
            want["Cmd"] = None  # ENTRYPOINT drops a CMD inherited from the base image
    elif word == "CMD":
        want["Cmd"], cmd_set = form(arg), True
    elif word == "ENV":
        parts = shlex.split(arg)
        if parts and "=" not in parts[0]:
            want["Env"][parts[0]] = arg.split(None, 1)[1].strip() if len(parts) > 1 else ""
        else:
            want["Env"].update(p.split("=", 1) for p in parts)
    elif word == "EXPOSE":
        want["ExposedPorts"] |= {p if "/" in p else p + "/tcp" for p in arg.split()}

img = json.load(open(inspect_path))[0]
cfg = img["Config"]
failed = False
def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed |= not ok

check(cfg.get("User", "") == want["User"], f"USER: image {cfg.get('User')!r}, Dockerfile {want['User']!r}")
check(entry_set or cmd_set, "the final stage sets ENTRYPOINT or CMD (not inherited from the base image)")
check(cfg.get("Entrypoint") == want["Entrypoint"], f"ENTRYPOINT: image {cfg.get('Entrypoint')}, Dockerfile {want['Entrypoint']}")
check(cfg.get("Cmd") == want["Cmd"], f"CMD: image {cfg.get('Cmd')}, Dockerfile {want['Cmd']}")
env = dict(e.split("=", 1) for e in cfg.get("Env") or [])
for k, v in want["Env"].items():
    check(env.get(k) == v, f"ENV {k}: image {env.get(k)!r}, Dockerfile {v!r}")
ports = set(cfg.get("ExposedPorts") or {})
check(bool(want["ExposedPorts"]) and want["ExposedPorts"] <= ports,
      f"EXPOSE: image {sorted(ports)}, Dockerfile {sorted(want['ExposedPorts'])}")

# USER as uid:gid, names looked up in the image's own /etc/passwd and /etc/group.
def entries(path):
    try:
        return [line.split(":") for line in open(mnt + path)]
    except OSError:
        return []
def lookup(path, name):
    if name.isdigit():
        return int(name)
    return next((int(f[2]) for f in entries(path) if f[0] == name), None)
user, _, group = (cfg.get("User") or "0").partition(":")
uid = lookup("/etc/passwd", user)
gid = lookup("/etc/group", group) if group else None
if gid is None:
    gid = next((int(f[3]) for f in entries("/etc/passwd") if f[2] == str(uid)), None)
check(uid is not None and uid != 0, f"the image's user is not root: uid {uid}")
m = re.search(r"^\s*runAsUser:\s*(\d+)", open(deployment).read(), re.M)
check(m is not None and uid == int(m.group(1)),
      f"the image's uid is the pod's runAsUser in {deployment}: image {uid}, runAsUser {m.group(1) if m else None}")

argv = (cfg.get("Entrypoint") or []) + (cfg.get("Cmd") or [])
check(bool(argv), f"default command: {argv}")
listen = env.get("GATEWAY__SERVER__LISTEN", "")
check(re.fullmatch(r"0\.0\.0\.0:\d+", listen) is not None and f"{listen.rsplit(':', 1)[1]}/tcp" in ports,
      f"the image listens on all interfaces on its EXPOSEd port: GATEWAY__SERVER__LISTEN={listen!r}, EXPOSE {sorted(ports)}")
with open(f"{work}/argv", "w") as f:
    f.write("\0".join(argv) + "\0")
with open(f"{work}/image.env", "w") as f:
    f.write(f"UID_GID={uid}:{gid}\nSIZE={img['Size']}\n")
sys.exit(1 if failed else 0)
PY
mapfile -d '' -t ARGV <"$WORK/argv"
# shellcheck disable=SC1091 # written just above
. "$WORK/image.env"
IMAGE_UID=${UID_GID%%:*}

CONFIG=""
for i in "${!ARGV[@]}"; do
    [ "${ARGV[$i]}" = "--config" ] && CONFIG=${ARGV[$((i + 1))]:-}
done
[ -n "$CONFIG" ] || die "the default command (${ARGV[*]}) passes no --config FILE"
[ -f "$MNT$CONFIG" ] || die "the default command's config $CONFIG is not in the image"

base_size=$(podman image inspect --format '{{.Size}}' "$DEBIAN_IMAGE" 2>/dev/null || echo 0)
log "image size"
awk -v s="$SIZE" -v b="$base_size" -v img="$IMAGE" 'BEGIN {
    printf "%s: %.1f MB (%.1f MiB); the runtime base debian:bookworm-slim is %.1f MB, the gateway adds %.1f MB\n",
        img, s / 1e6, s / 1048576, b / 1e6, (s - b) / 1e6 }'

# --- 5. run ---------------------------------------------------------------------

log "gateway check --config $CONFIG inside the image"
buildah run --isolation chroot "$CTR" -- "${ARGV[0]}" check --config "$CONFIG" >"$WORK/check.out" 2>&1 ||
    {
        cat "$WORK/check.out"
        die "\`${ARGV[0]} check --config $CONFIG\` failed inside the image"
    }
cat "$WORK/check.out"

# From the resolved configuration: the listen address and the first proxy
# route, e.g. "route b  *  /b  proxy -> service_a (http://127.0.0.1:8000) rewrite /a"
# (name, hosts, prefix, target).
LISTEN=$(awk '$1 == "listen" { print $2; exit }' "$WORK/check.out")
read -r ROUTE_PREFIX UPSTREAM_URL REWRITE < <(
    sed -nE 's/^route +[^ ]+ +[^ ]+ +([^ ]+) +.*proxy -> [^ ]+ \(([^)]+)\)( rewrite ([^ ]+))?.*/\1 \2 \4/p' "$WORK/check.out" | head -n 1
) || true
[ -n "$LISTEN" ] || die "gateway check printed no listen address"
[ -n "${UPSTREAM_URL:-}" ] || die "the image's config has no proxy route to check"
UP_ADDR=${UPSTREAM_URL#http://}
UP_ADDR=${UP_ADDR%/}
[ "${UP_ADDR%:*}" = 127.0.0.1 ] ||
    die "the proxy route $ROUTE_PREFIX goes to $UPSTREAM_URL; this check (the sidecar layout) needs a 127.0.0.1 upstream"
[ "${REWRITE:-}" = /a ] ||
    die "the proxy route $ROUTE_PREFIX rewrites to '${REWRITE:-}'; the check's upstream (gateway upstream) answers 'ok' on /a"

port_free() { # ADDR PORT
    python3 -c 'import socket, sys
s = socket.socket()
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(1)' "$1" "$2"
}
holder() { ss -Hltnp "sport = :$1" 2>/dev/null | awk '{print $4, $6}' | head -n 3 | tr '\n' ' '; }

log "ports"
UP_PORT=${UP_ADDR##*:}
port_free 127.0.0.1 "$UP_PORT" ||
    die "127.0.0.1:$UP_PORT is in use ($(holder "$UP_PORT")); the image's config proxies $ROUTE_PREFIX there (sidecar layout), so the check's upstream must listen there: stop what holds it and run again"
GW_PORT=${LISTEN##*:}
if port_free 0.0.0.0 "$GW_PORT"; then
    echo "127.0.0.1:$UP_PORT and $LISTEN are free"
else
    wanted=$GW_PORT
    GW_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo "NOTE: $LISTEN is in use ($(holder "$wanted")); this run overrides GATEWAY__SERVER__LISTEN=0.0.0.0:$GW_PORT in the working container (not the image)"
    buildah config --env "GATEWAY__SERVER__LISTEN=0.0.0.0:$GW_PORT" "$CTR"
fi

if [ -z "$UPSTREAM_BIN" ]; then
    UPSTREAM_BIN=$WORK/gateway-from-image
    cp "$MNT${ARGV[0]}" "$UPSTREAM_BIN"
fi
[ -x "$UPSTREAM_BIN" ] || die "upstream binary $UPSTREAM_BIN not found"

# wait_http URL PID SECONDS: until URL answers 2xx; fails early if PID died.
wait_http() {
    local url=$1 pid=$2 deadline=$((SECONDS + $3))
    until curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || die "$4 exited before $url answered"
        [ "$SECONDS" -lt "$deadline" ] || die "$url did not answer within $3s ($4)"
        sleep 0.2
    done
}

log "gateway upstream on the host at $UP_ADDR ($UPSTREAM_BIN)"
"$UPSTREAM_BIN" upstream --listen "$UP_ADDR" --delay 10ms >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_http "http://$UP_ADDR/hello" "$!" 15 "the upstream"

log "the image's default command: ${ARGV[*]} (buildah run --isolation chroot)"
# Its own process group, so that every process under buildah run is stopped.
setsid buildah run --isolation chroot "$CTR" -- "${ARGV[@]}" >"$WORK/container.log" 2>&1 &
RUN_PID=$!
PGIDS+=("$RUN_PID")
BASE_URL=http://127.0.0.1:$GW_PORT
wait_http "$BASE_URL/healthz" "$RUN_PID" 20 "the container (buildah run)"

GW_PID=$(pgrep -g "$RUN_PID" -x "$(basename "${ARGV[0]}" | cut -c1-15)" | head -n 1 || true)
[ -n "$GW_PID" ] || die "no $(basename "${ARGV[0]}") process under buildah run"
read -r _ ruid euid _ < <(grep '^Uid:' "/proc/$GW_PID/status")
{ [ "$ruid" = "$IMAGE_UID" ] && [ "$euid" = "$IMAGE_UID" ]; } ||
    die "the gateway process runs as uid $ruid/$euid, the image says $IMAGE_UID"
root=$(readlink "/proc/$GW_PID/root")
[ "$root" != / ] || die "the gateway process is not inside the image's root filesystem"
echo "pid $GW_PID: uid $ruid, root filesystem $root"

expect() { # PATH CODE [BODY]
    local path=$1 want=$2 body=${3-} got
    got=$(curl -s -o "$WORK/body" -w '%{http_code}' --max-time 5 "$BASE_URL$path" || true)
    [ "$got" = "$want" ] || die "GET $path answered ${got:-nothing}, expected $want"
    if [ -n "$body" ]; then
        [ "$(cat "$WORK/body")" = "$body" ] || die "GET $path answered '$(head -c 200 "$WORK/body")', expected '$body'"
    fi
    echo "GET $path -> $got${body:+ $body}"
}
expect /healthz 200
expect /readyz 200
expect /metrics 200
grep -q '^gateway_connections_total' "$WORK/body" || die "/metrics has no gateway_connections_total: not the gateway's metrics"
expect /file 200
expect "$ROUTE_PREFIX" 200 ok
echo "(proxied by the container to gateway upstream at $UP_ADDR)"

log "SIGTERM to the gateway (pid $GW_PID)"
kill -TERM "$GW_PID"
for _ in $(seq 1 100); do
    kill -0 "$RUN_PID" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$RUN_PID" 2>/dev/null && die "the gateway did not exit within 10s of SIGTERM"
rc=0
wait "$RUN_PID" || rc=$?
[ "$rc" -eq 0 ] || die "the gateway exited with status $rc after SIGTERM"
echo "exited with status 0"

log "summary"
awk -v s="$SIZE" -v img="$IMAGE" -v t="$BUILD_SECONDS" 'BEGIN { printf "%s: %.1f MB, built in %ds\n", img, s / 1e6, t }'
