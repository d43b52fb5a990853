#!/usr/bin/env bash
# Install (or upgrade) the p2pnode agent as a systemd service. Idempotent: run it again to upgrade.
#
#   sudo deploy/install.sh                       # the package from this checkout
#   sudo deploy/install.sh --wheel p2pnode-0.1.0-py3-none-any.whl
#
# What it does (each step is skipped when already done):
#   - a venv under $PREFIX/.venv (default /opt/p2pnode) with the package and its dependencies (upgraded in place)
#   - the system user and group p2pnode (no login, home /var/lib/p2pnode)
#   - the data dir /var/lib/p2pnode (mode 0750, owned by p2pnode)
#   - /etc/p2pnode/p2pnode.toml from deploy/p2pnode.example.toml, only if absent (yours is never overwritten)
#   - the command /usr/local/bin/p2pnode, a link into the venv (not replacing another file of that name)
#   - the unit /etc/systemd/system/p2pnode.service (replaced: customise with drop-ins), enabled; started on a first
#     install, restarted on an upgrade when it runs (not with --no-start, nor where systemd is not running)
#
# Options:
#   --wheel FILE       install this wheel (default: the checkout this script lives in)
#   --prefix DIR       where the venv goes (default /opt/p2pnode; the unit's ExecStart follows)
#   --root DIR         install into DIR as the target's / (DESTDIR-style: a chroot, an image); creates no user
#                      (a sysusers.d entry makes it at boot), and enables the unit with `systemctl --root` (no
#                      running systemd is touched). The venv is
#                      built under DIR and made to run at PREFIX where the image boots (its scripts and
#                      pyvenv.cfg name PREFIX); the image must have the --python interpreter at the same path.
#   --python PY        interpreter for the venv (default python3; Python >= 3.11, one the user p2pnode can run:
#                      not a pyenv/conda/uv build under /root or /home, which the unit's ProtectHome= hides)
#   --pip-args "ARGS"  extra pip arguments, e.g. "--no-index --find-links /srv/wheels" for an offline install
#   --no-user          do not create the user p2pnode (the data dir stays root's)
#   --no-systemctl     install the unit but do not run systemctl at all
#   --no-start         enable the unit but do not start or restart it
# Uninstall: docs/operations.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wheel="" prefix="/opt/p2pnode" root="" python="python3" pip_args="" make_user=1 use_systemctl=1 start=1

die() { echo "install.sh: $*" >&2; exit 2; }
say() { echo "install.sh: $*"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel="${2:?--wheel needs a file}"; shift 2 ;;
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
        --pip-args) pip_args="${2-}"; shift 2 ;;
        --no-user) make_user=0; shift ;;
        --no-systemctl) use_systemctl=0; shift ;;
        --no-start) start=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

case "$prefix" in /*) ;; *) die "--prefix must be an absolute path" ;; esac
case "$prefix" in *[!A-Za-z0-9._/+-]*) die "--prefix may hold only letters, digits and . _ / + -" ;; esac
if [ -n "$root" ]; then
    mkdir -p "$root"
    root="$(cd "$root" && pwd)"
    make_user=0
elif [ "$(id -u)" != 0 ]; then
    die "run as root (or with --root DIR to install into a directory)"
fi
if [ -n "$wheel" ]; then
    [ -f "$wheel" ] || die "no wheel at $wheel"
    pkg="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
else
    [ -f "$here/../pyproject.toml" ] || die "no --wheel given and $here/.. is not a p2pnode checkout"
    pkg="$(cd "$here/.." && pwd)"
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die "$python is not Python >= 3.11 (choose one with --python)"

venv="$root$prefix/.venv"
data="$root/var/lib/p2pnode"
etc="$root/etc/p2pnode"
unit_dir="$root/etc/systemd/system"
unit="$unit_dir/p2pnode.service"

# 1. The venv and the package. A rebuilt wheel of an unchanged version is reinstalled too (--force-reinstall of
#    the package alone; its dependencies are upgraded only where the new version asks for it).
#    pip and p2pnode run as `python -m` here: with --root the venv's scripts name the target path, not this one.
relocate() {  # $1: where the venv is now, $2: where it runs on the target. Points its scripts' interpreter lines
    #           (pip writes `#!PATH`, or an `exec PATH` line when PATH is long), activate scripts and pyvenv.cfg
    #           at $2; its interpreter link and compiled files need no change.
    local from_re to f
    from_re="$(printf '%s' "$1" | sed 's/[][\.*^$|]/\\&/g')"
    to="$2"
    for f in "$1"/bin/*; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        if [ "$(head -c 2 "$f")" = '#!' ]; then
            sed -i "1,3s|$from_re/bin/|$to/bin/|g" "$f"
        fi
        case "$f" in */activate*) sed -i "s|$from_re|$to|g" "$f" ;; esac
    done
    sed -i "s|$from_re|$to|g" "$1/pyvenv.cfg"
}
# The interpreter the venv runs on (the venv links to it and reads its standard library) must be one the service
# can run: the unit runs as p2pnode with ProtectHome=yes (no /root, /home, /run/user), so a pyenv, conda or uv
# build in root's home -- often the default python3 of an interactive root shell -- gives a venv that fails at the
# service's first start. Refused here in one line. As root, also run by an unprivileged user (nobody).
check_python() {  # $1: an interpreter (the --python one, or an existing venv's); $2: what to tell the operator
    local base exe prefix p
    base="$("$1" -c 'import os, sys
print(os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable))
print(os.path.realpath(sys.base_prefix))')" || die "$1 does not run"
    exe="${base%%$'\n'*}" prefix="${base#*$'\n'}"
    for p in "$exe" "$prefix"; do
        case "$p/" in
            /root/*|/home/*|/run/user/*) die "$1 runs from $p, under a home directory the service (user" \
                "p2pnode, ProtectHome=yes) cannot reach: $2 a system interpreter, e.g. --python /usr/bin/python3.11" ;;
        esac
    done
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
        # (exec'd by a shell that already runs as nobody: setpriv's own exec was seen to pass a path nobody may
        # not search)
        setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'exec "$0" -I -c "import encodings, json"' "$exe" \
            >/dev/null 2>&1 \
            || die "$1 runs $exe, which an unprivileged user (nobody) cannot run, nor can the service's user" \
                "p2pnode: $2 an interpreter every user may run, e.g. --python /usr/bin/python3.11"
    fi
}
upgrade=0
if [ -x "$venv/bin/python" ]; then
    check_python "$venv/bin/python" "remove $venv and install again with"
else
    check_python "$python" "choose"
fi
if [ -f "$venv/bin/p2pnode" ] && [ -x "$venv/bin/python" ]; then
    upgrade=1
    say "upgrading $("$venv/bin/python" -m p2pnode --version 2>/dev/null || echo p2pnode) in $venv"
elif [ ! -x "$venv/bin/python" ]; then
    say "creating the venv $venv"
    "$python" -m venv "$venv"
fi
# shellcheck disable=SC2086  # pip_args is a list of words
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pip_args "$pkg"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps $pip_args "$pkg"
say "installed $("$venv/bin/python" -m p2pnode --version)"
if [ -n "$root" ]; then
    relocate "$venv" "$prefix/.venv"
    say "the venv runs at $prefix/.venv where $root is the root"
    interp="$(readlink "$venv/bin/python3" || readlink "$venv/bin/python" || true)"
    case "$interp" in
        /*) [ -e "$root$interp" ] || say "note: the venv's interpreter $interp is not in $root: the image must" \
                "provide it at that path (choose another with --python)" ;;
    esac
fi

# The command on PATH: a link into the venv, never over a file that is not such a link.
link="$root/usr/local/bin/p2pnode"
if [ -L "$link" ] || [ ! -e "$link" ]; then
    install -d -m 0755 "$root/usr/local/bin"
    ln -sfn "$prefix/.venv/bin/p2pnode" "$link"
else
    say "left $link alone (not a link): the command is $prefix/.venv/bin/p2pnode"
fi

# 2. The user.
owner="root"
if [ "$make_user" = 1 ]; then
    if ! getent passwd p2pnode >/dev/null; then
        nologin="$(command -v nologin || echo /usr/sbin/nologin)"
        useradd --system --user-group --home-dir /var/lib/p2pnode --no-create-home --shell "$nologin" p2pnode
        say "created the system user p2pnode"
    fi
    owner="p2pnode"
fi

# In an image, the user is made where it boots: systemd-sysusers reads this at boot (the unit's StateDirectory=
# then hands it the data dir).
if [ -n "$root" ]; then
    install -d -m 0755 "$root/usr/lib/sysusers.d"
    echo 'u p2pnode - "p2pnode GPU fleet agent" /var/lib/p2pnode' > "$root/usr/lib/sysusers.d/p2pnode.conf"
    say "the user p2pnode is created at boot (usr/lib/sysusers.d/p2pnode.conf)"
fi

# 3. The data dir (the unit's StateDirectory= would create it too; made here so that it exists before a first
#    start and for runs by hand).
install -d -m 0750 -o "$owner" -g "$owner" "$data"

# 4. The config: an example, only where there is none.
install -d -m 0755 "$etc"
if [ -e "$etc/p2pnode.toml" ]; then
    say "kept $etc/p2pnode.toml"
else
    # In an image the group p2pnode does not exist yet: the file holds no secret (those go in /etc/p2pnode/env,
    # mode 0600), so it is world-readable there.
    mode=0640; [ -n "$root" ] && mode=0644
    install -m "$mode" -o root -g "$owner" "$here/p2pnode.example.toml" "$etc/p2pnode.toml"
    say "wrote the example config $etc/p2pnode.toml (edit join, tags and trust; see docs/configuration.md)"
fi

# 5. The unit, its ExecStart following --prefix.
install -d -m 0755 "$unit_dir"
sed "s|/opt/p2pnode/.venv/bin/p2pnode|$prefix/.venv/bin/p2pnode|" "$here/p2pnode.service" > "$unit.tmp"
chmod 0644 "$unit.tmp"
mv -f "$unit.tmp" "$unit"
say "installed the unit $unit"

# 6. Enable (and start or restart).
if [ "$use_systemctl" = 0 ]; then
    say "not running systemctl (--no-systemctl): systemctl daemon-reload && systemctl enable --now p2pnode"
elif [ -n "$root" ]; then
    systemctl --root="$root" enable p2pnode.service
elif [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable p2pnode.service
    if [ "$start" = 1 ]; then
        if [ "$upgrade" = 1 ]; then
            systemctl try-restart p2pnode.service
            say "restarted p2pnode if it was running"
        else
            systemctl start p2pnode.service
            say "started p2pnode: systemctl status p2pnode; p2pnode status"
        fi
    fi
else
    systemctl enable p2pnode.service
    say "systemd is not running here: the unit is enabled and starts at the next boot"
fi
