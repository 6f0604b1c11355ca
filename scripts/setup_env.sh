#!/usr/bin/env bash
# Creates (or repairs, or reuses) the project's virtual environment and installs what one command needs.
#
#   source scripts/setup_env.sh && la_trainer_setup demo    # runtime + plots (the demo's report picture)
#   source scripts/setup_env.sh && la_trainer_setup test    # runtime + plots + dev tools (ruff, mypy, pytest)
#
# Safe to source from an interactive shell: everything happens inside the function, which returns non-zero
# on failure (no `set -e`, no `exit`), and only PATH and VIRTUAL_ENV are changed in the caller's shell.
#
# Environment:
#   LA_TRAINER_VENV   where the environment goes (default: <repo>/.venv)
#   PYTHON            the interpreter to create it with (default: the first of python3.13, python3.12,
#                     python3.11, python3 that is 3.11 or newer)
#   LA_TRAINER_TORCH  cpu | cuXXX (e.g. cu126): install torch from PyTorch's index of that build first
#                     (default: whatever pip picks for torch==<constraints.txt>; see constraints.txt)

la_trainer_setup() {
    local purpose="${1:-demo}" root venv python extras hash stamp candidate
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    venv="${LA_TRAINER_VENV:-$root/.venv}"
    case "$purpose" in
        demo) extras="plots" ;;
        test) extras="dev,plots" ;;
        *) echo "la_trainer_setup: unknown purpose '$purpose' (demo or test)" >&2; return 2 ;;
    esac

    python="${PYTHON:-}"
    if [ -z "$python" ]; then
        for candidate in python3.13 python3.12 python3.11 python3; do
            if command -v "$candidate" >/dev/null 2>&1 &&
                "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
                python="$candidate"
                break
            fi
        done
    fi
    if [ -z "$python" ]; then
        echo "la-trainer needs Python 3.11 or newer (the engine's own is 3.11); none was found on PATH." >&2
        echo "Install one (e.g. sudo apt install python3.11 python3.11-venv) or set PYTHON=/path/to/python3.11." >&2
        return 1
    fi

    # A venv is usable when its interpreter runs and has pip. A half-made one (python3 -m venv failed
    # for want of ensurepip, or the base interpreter was upgraded away) is removed and made again.
    if [ -e "$venv" ] && ! "$venv/bin/python" -c 'import pip' >/dev/null 2>&1; then
        if [ -f "$venv/pyvenv.cfg" ] || [ -z "$(ls -A "$venv" 2>/dev/null)" ]; then
            echo "The virtual environment in $venv is broken (no working python with pip); making it again."
            rm -rf "$venv" || return 1
        else
            echo "$venv exists but is not a virtual environment; move it away or set LA_TRAINER_VENV." >&2
            return 1
        fi
    fi
    if [ ! -e "$venv" ]; then
        echo "Creating a virtual environment in $venv with $python ($("$python" --version 2>&1))"
        if ! "$python" -m venv "$venv"; then
            rm -rf "$venv"
            echo "Could not create it. On Debian/Ubuntu: sudo apt install python3-venv (or python3.11-venv)." >&2
            return 1
        fi
    fi

    stamp="$venv/.la-trainer-installed-$purpose"
    hash="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)${LA_TRAINER_TORCH:+-$LA_TRAINER_TORCH}"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$hash" ]; then
        if [ -n "${LA_TRAINER_TORCH:-}" ]; then
            echo "Installing torch ($LA_TRAINER_TORCH build) from PyTorch's index"
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$root/constraints.txt" \
                torch --index-url "https://download.pytorch.org/whl/$LA_TRAINER_TORCH" || return 1
        fi
        echo "Installing la-trainer[$extras] with the tested versions (constraints.txt)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$root/constraints.txt" \
            -e "$root[$extras]" || return 1
        echo "$hash" >"$stamp"
    fi
    export VIRTUAL_ENV="$venv"
    case ":$PATH:" in
        *":$venv/bin:"*) ;;
        *) export PATH="$venv/bin:$PATH" ;;
    esac
}
