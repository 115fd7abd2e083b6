# Sourced by scripts/setup.sh and scripts/lock.sh: how uv is run for hvdflow's environments.
# - Its cache (UV_CACHE_DIR, else uv's default under ~/.cache) is shared by every clone and
#   profile: on the same file system uv links packages from it instead of copying, so a second
#   environment of the same packages costs seconds and almost no disk.
# - It never downloads a Python build (only package registries are reachable): the interpreter is
#   handed to it.
# - The machine's pip configuration still counts: pip's find-links (PIP_FIND_LINKS, else
#   `pip config`) become uv's, which is where a CPU machine keeps PyTorch's CPU build.
# - It compiles every installed module to bytecode, as pip does: uv's default leaves that to the
#   first import, and where PYTHONDONTWRITEBYTECODE is set (CI, the suite's ~600 processes) every
#   process then compiled TensorFlow's Python anew, which made the suite 40% slower.
export UV_PYTHON_DOWNLOADS=never
export UV_COMPILE_BYTECODE=1
export UV_NO_PROGRESS=1
if [ -z "${UV_FIND_LINKS:-}" ]; then
  links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
  # pip separates several with spaces or newlines, uv with commas.
  links=$(printf '%s' "$links" | tr -s ' \n' ',,' | sed 's/^,//; s/,$//')
  [ -z "$links" ] || export UV_FIND_LINKS=$links
  unset links
fi
