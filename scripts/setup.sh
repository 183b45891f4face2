# Sourced by scripts/test.sh and scripts/run.sh (and through test.sh by .ci/run): installs what
# the build needs when it is missing, and prints nothing when everything is there.
#   fa_setup_cxx      cmake (>= 3.24), g++, GoogleTest: apt-get when root (or password-less
#                     sudo), else a message naming the packages
#   fa_setup_python   pip, then nanobind (>= 2), scikit-build-core (>= 0.10), numpy, pytest.
#                     A Python that refuses pip installs (PEP 668, Debian's system Python) gets a
#                     virtual environment in $FLASHATTN_VENV (default: .venv), which
#                     sees the system's packages (torch, if installed).
#   fa_setup_torch    (CI: FLASHATTN_SETUP_TORCH=1) PyTorch when no working torch is there, so
#                     that the torch tests (custom ops, autograd, torch.compile, the fast path)
#                     run on CPU tensors without a GPU. PyPI's Linux wheel with its
#                     dependencies (its CUDA libraries included: `import torch` needs them;
#                     about 4.5 GB installed). A failed install is reported, a torch that does
#                     not import is removed again, and the torch tests then skip. With a
#                     working torch, also transformers (pinned; fa_setup_transformers) for
#                     the transformers backend tests.
# All set PYTHON to the interpreter to use. FLASHATTN_SETUP=0 skips every install.
# shellcheck shell=bash

PYTHON=${PYTHON:-python3}

fa_apt_install() {
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "flashattn setup: missing $*; install them with: apt-get install $*" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null; then
    echo "flashattn setup: missing $* and no apt-get here; install them with your package manager" >&2
    return 1
  fi
  echo "flashattn setup: installing $* (apt-get)" >&2
  "${sudo[@]}" apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null
}

fa_cmake_new_enough() {
  local v
  v=$(cmake --version 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+' | head -n1) || return 1
  [ -n "$v" ] && [ "${v%%.*}" -gt 3 -o \( "${v%%.*}" -eq 3 -a "${v#*.}" -ge 24 \) ]
}

fa_setup_cxx() {
  [ "${FLASHATTN_SETUP:-1}" = 0 ] && return 0
  local need=()
  command -v cmake >/dev/null || need+=(cmake)
  command -v g++ >/dev/null || need+=(g++)
  command -v make >/dev/null || command -v ninja >/dev/null || need+=(make)
  [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || need+=(libgtest-dev)
  if [ ${#need[@]} -gt 0 ]; then fa_apt_install "${need[@]}" || return 1; fi
  if ! fa_cmake_new_enough; then
    echo "flashattn setup: CMake >= 3.24 needed; installing it with pip" >&2
    fa_setup_pip || return 1
    "$PYTHON" -m pip install -q --disable-pip-version-check "cmake>=3.24" || return 1
    hash -r
  fi
}

fa_setup_pip() {
  "$PYTHON" -m pip --version >/dev/null 2>&1 && return 0
  fa_apt_install python3-pip python3-venv
}

# Prints the requirements that are missing or too old (empty when none).
fa_python_missing() {
  "$PYTHON" - <<'PY'
import importlib.metadata as md
need = {"nanobind": (2,), "scikit-build-core": (0, 10), "numpy": (), "pytest": ()}
for name, least in need.items():
    try:
        have = tuple(int(x) for x in md.version(name).split(".")[:2] if x.isdigit())
    except md.PackageNotFoundError:
        have = None
    if have is None or have < least:
        print(name + (">=" + ".".join(map(str, least)) if least else ""))
PY
}

fa_setup_python() {
  [ "${FLASHATTN_SETUP:-1}" = 0 ] && return 0
  local missing
  missing=$(fa_python_missing) || return 1
  [ -z "$missing" ] && return 0
  fa_setup_pip || return 1
  # shellcheck disable=SC2086
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check $missing 2>/tmp/flashattn-pip.$$; then
    if grep -q externally-managed /tmp/flashattn-pip.$$; then
      local venv=${FLASHATTN_VENV:-.venv}
      echo "flashattn setup: this Python is managed by the system; using the virtual environment $venv" >&2
      if [ ! -x "$venv/bin/python" ]; then
        "$PYTHON" -m venv --system-site-packages "$venv" 2>/dev/null ||
          { fa_apt_install python3-venv && "$PYTHON" -m venv --system-site-packages "$venv"; } || return 1
      fi
      PYTHON=$venv/bin/python
      missing=$(fa_python_missing) || return 1
      # shellcheck disable=SC2086
      [ -z "$missing" ] || "$PYTHON" -m pip install -q --disable-pip-version-check $missing || return 1
    else
      cat /tmp/flashattn-pip.$$ >&2
      rm -f /tmp/flashattn-pip.$$
      return 1
    fi
  fi
  rm -f /tmp/flashattn-pip.$$
}

# The torch release CI installs: pinned, so that a new release cannot turn CI red on its own.
FLASHATTN_CI_TORCH=${FLASHATTN_CI_TORCH:-torch==2.15.0}

fa_torch_works() {
  "$PYTHON" -c "import torch; torch.ones(2).sum()" >/dev/null 2>&1
}

fa_setup_torch() {
  [ "${FLASHATTN_SETUP:-1}" = 0 ] && return 0
  if fa_torch_works; then
    fa_setup_transformers
    return 0
  fi
  fa_setup_pip || return 0
  echo "flashattn setup: installing $FLASHATTN_CI_TORCH for the torch tests (CPU tensors)" >&2
  local log
  log=$(mktemp) || return 0
  # --no-cache-dir: the wheels (about 2.5 GB) are not kept beside the installed 4.5 GB.
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check --no-cache-dir "$FLASHATTN_CI_TORCH" \
         >"$log" 2>&1 || ! fa_torch_works; then
    tail -n 5 "$log" >&2
    echo "flashattn setup: WARNING: no working torch; the torch tests will be skipped" >&2
    # A torch that does not import would fail the tests instead of skipping them.
    "$PYTHON" -m pip uninstall -y -q torch >/dev/null 2>&1 || true
  fi
  rm -f "$log"
  fa_torch_works && fa_setup_transformers
  return 0
}

# transformers for tests/python/test_transformers.py (the "fattn" attention backend on tiny
# Llama / Mistral / Qwen2 / gpt-oss models, CPU backend), pinned like torch (its dependencies
# include compiled wheels: tokenizers, safetensors). An installed transformers that has gpt-oss
# (4.55 or later) is used as it is.
FLASHATTN_CI_TRANSFORMERS=${FLASHATTN_CI_TRANSFORMERS:-transformers==5.25.0}

fa_transformers_works() {
  "$PYTHON" -c "import transformers; transformers.GptOssConfig" >/dev/null 2>&1
}

fa_setup_transformers() {
  fa_transformers_works && return 0
  # An older transformers that imports is left in place if the install fails.
  local had=0
  "$PYTHON" -c "import transformers" >/dev/null 2>&1 && had=1
  echo "flashattn setup: installing $FLASHATTN_CI_TRANSFORMERS for the transformers tests" >&2
  local log
  log=$(mktemp) || return 0
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check --no-cache-dir \
         "$FLASHATTN_CI_TRANSFORMERS" >"$log" 2>&1 || ! fa_transformers_works; then
    tail -n 5 "$log" >&2
    echo "flashattn setup: WARNING: no working transformers; its tests will be skipped" >&2
    # One that does not import would fail the tests instead of skipping them.
    [ "$had" = 1 ] || "$PYTHON" -m pip uninstall -y -q transformers >/dev/null 2>&1 || true
  fi
  rm -f "$log"
  return 0
}
