#!/usr/bin/env bash
# run.sh of a GPU bundle (made by tools/gpu_bundle.sh / tools/gpu_bundle_collect.sh): runs a
# bundled binary on a machine that lacks the build machine's libraries, e.g. the GPU machine
# (CUDA 13, no Bazel). It finds the CUDA libraries the binary needs on this machine (listed in
# bin/NAME.cuda-libs), stops with a message naming any that is missing and where it looked,
# then runs the binary under the bundled glibc loader with the bundled libraries first:
#   lib/ld-linux-x86-64.so.2 --library-path <bundle>/lib:<CUDA dirs> bin/NAME args...
#
# Usage: run.sh NAME|path/to/bin/NAME [args...]     e.g. gpu_bundle/run.sh gpu_bundle/bin/cast_test
#        run.sh --list                               the bundled binaries
# Environment:
#   GPU_BUNDLE_CUDA_DIRS=d1:d2   search only these folders for CUDA libraries (default: the
#                                caller's LD_LIBRARY_PATH, /usr/local/cuda/lib64, the
#                                driver's folders, `ldconfig -p`, PyTorch's nvidia/*/lib)
#   GPU_BUNDLE_ALLOW_NO_DRIVER=1 run even without libcuda.so.1 (CUDA calls then fail; the
#                                project's GPU tests skip): checks the bundle on a CPU machine
#   GPU_BUNDLE_VERBOSE=1         print where each CUDA library was found and the library path
#   GPU_BUNDLE_PRINT_COMMAND=1   print the command instead of running it, one word a line
#                                (env VAR=..., the loader, its --library-path, the binary, the
#                                arguments): for a profiler that should start the program
#                                itself rather than this script and its helpers (ncu; it
#                                counts the exec'd loader as a child: --target-processes all)
#   GPU_BUNDLE_LOADER=auto|bundled|host
#                                whose glibc runs the binary. auto (the default): the host's
#                                when it is newer than the bundled one, because the host's CUDA
#                                libraries may need it (PyTorch's libnccl.so.2 needs GLIBC_2.38,
#                                Debian 12's is 2.36); else the bundled one, which runs where
#                                the host's glibc is older. With the host's, the bundled glibc
#                                is left out of the library path, and so are libstdc++ and
#                                libgcc_s when the host's have every symbol version ours have.
# A binary that starts other bundled binaries (tools:launch) must start wrap/NAME, not bin/NAME.
set -euo pipefail

bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=${PATH:-/usr/local/bin:/usr/bin:/bin}

die() { echo "run.sh: $*" >&2; exit 127; }
say() { [[ "${GPU_BUNDLE_VERBOSE:-0}" != 1 ]] || echo "run.sh: $*" >&2; }

list_binaries() {
  local f
  for f in "$bundle"/bin/*; do
    [[ -f "$f" && -x "$f" && "$f" != *.ldd && "$f" != *.cuda-libs ]] && basename "$f"
  done
  return 0
}

if (( $# < 1 )) || [[ "$1" == -h || "$1" == --help ]]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2
  echo "bundled: $(list_binaries | tr '\n' ' ')" >&2
  exit 2
fi
if [[ "$1" == --list ]]; then list_binaries; exit 0; fi

name=$(basename "$1"); shift
bin=$bundle/bin/$name
[[ -f "$bin" && -x "$bin" ]] ||
  die "no binary '$name' in $bundle/bin (bundled: $(list_binaries | tr '\n' ' '))"
loader=$bundle/lib/ld-linux-x86-64.so.2
[[ -f "$loader" ]] || die "the bundle has no lib/ld-linux-x86-64.so.2: it is incomplete, make it again"

needs=()
if [[ -f "$bin.cuda-libs" ]]; then
  while IFS= read -r so; do [[ -n "$so" ]] && needs+=("$so"); done < "$bin.cuda-libs"
fi

# --- where CUDA libraries may be -------------------------------------------------------------
declare -A found=()     # soname -> folder
searched=()             # every folder looked in, in order
search_in() {           # search_in DIR...: fills found[] for the needs not yet found
  local d so
  for d in "$@"; do
    [[ -n "$d" && -d "$d" ]] || continue
    searched+=("$d")
    for so in "${needs[@]}"; do
      [[ -z "${found[$so]:-}" && -e "$d/$so" ]] && found[$so]=$d
    done
  done
  return 0
}
missing() {
  local so
  for so in "${needs[@]}"; do [[ -n "${found[$so]:-}" ]] || echo "$so"; done
  return 0
}

if (( ${#needs[@]} > 0 )); then
  if [[ -n "${GPU_BUNDLE_CUDA_DIRS+set}" ]]; then
    IFS=: read -ra dirs <<< "$GPU_BUNDLE_CUDA_DIRS"
    search_in "${dirs[@]}"
  else
    IFS=: read -ra dirs <<< "${LD_LIBRARY_PATH:-}"
    search_in "${dirs[@]}"
    search_in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
              /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
              /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib
    # The host's loader cache.
    if [[ -n "$(missing)" ]]; then
      for ldconfig in /sbin/ldconfig /usr/sbin/ldconfig "$(command -v ldconfig || true)"; do
        [[ -x "$ldconfig" ]] || continue
        cache_dirs=()
        while IFS= read -r so; do
          p=$("$ldconfig" -p 2>/dev/null | awk -v s="$so" '$1 == s && /x86-64/ { print $NF; exit }')
          [[ -n "$p" ]] && cache_dirs+=("$(dirname "$p")")
        done < <(missing)
        searched+=("(the loader cache: $ldconfig -p)")
        search_in "${cache_dirs[@]}"
        break
      done
    fi
    # Python wheels (PyTorch's nvidia-*-cu13 packages: nvidia/<pkg>/lib, nvidia/cu13/lib).
    if [[ -n "$(missing)" ]]; then
      pip_roots=()
      for py in "${GPU_BUNDLE_PYTHON:-}" python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
        if [[ -z "$py" ]] || ! command -v "$py" >/dev/null; then continue; fi
        while IFS= read -r r; do [[ -n "$r" ]] && pip_roots+=("$r"); done < <(
          "$py" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null || true)
      done
      for r in /opt/torch/.venv/lib/python3*/site-packages/nvidia \
               /usr/local/lib/python3*/dist-packages/nvidia /usr/lib/python3/dist-packages/nvidia; do
        [[ -d "$r" ]] && pip_roots+=("$r")
      done
      pip_dirs=()
      for r in "${pip_roots[@]}"; do
        for d in "$r"/*/lib "$r"/*/*/lib; do [[ -d "$d" ]] && pip_dirs+=("$d"); done
      done
      searched+=("(python3's nvidia/*/lib: ${#pip_dirs[@]} folders)")
      search_in "${pip_dirs[@]}"
    fi
  fi
fi

# --- missing libraries: say which, and where we looked -----------------------------------------
mapfile -t lost < <(missing)
driver_missing=0
if (( ${#lost[@]} > 0 )); then
  hard=()
  for so in "${lost[@]}"; do
    if [[ "$so" == libcuda.so.1 ]]; then driver_missing=1; else hard+=("$so"); fi
  done
  looked=$(printf '  %s\n' "${searched[@]}" | awk '!seen[$0]++')
  [[ -n "$looked" ]] || looked="  (no folder: GPU_BUNDLE_CUDA_DIRS names none that exists)"
  if (( ${#hard[@]} > 0 )); then
    {
      echo "run.sh: $name needs CUDA libraries this machine lacks: ${hard[*]}"
      for so in "${hard[@]}"; do
        case "$so" in
          libnccl*) echo "  $so: NCCL comes with CUDA installs or PyTorch's pip package nvidia-nccl-cu13 (nvidia/nccl/lib)" ;;
          libcudnn*) echo "  $so: cuDNN 9 (PyTorch's nvidia-cudnn-cu13, or the CUDA install)" ;;
          *) echo "  $so: part of the CUDA 13 toolkit (/usr/local/cuda/lib64) or PyTorch's nvidia-* pip packages" ;;
        esac
      done
      echo "Looked in:"
      echo "$looked"
      echo "Set GPU_BUNDLE_CUDA_DIRS=dir1:dir2 to name the folders that hold them."
      if (( driver_missing )); then
        echo "Also missing: libcuda.so.1, the NVIDIA driver's library (no GPU driver here)."
      fi
    } >&2
    exit 127
  fi
  if [[ "${GPU_BUNDLE_ALLOW_NO_DRIVER:-0}" != 1 ]]; then
    {
      echo "run.sh: no CUDA driver library (libcuda.so.1) found: this machine has no NVIDIA GPU driver, and $name needs one."
      echo "Looked in:"
      echo "$looked"
      echo "On a GPU machine it is in the driver's folder (e.g. /usr/local/nvidia/lib64 or /usr/lib/x86_64-linux-gnu): name it with GPU_BUNDLE_CUDA_DIRS."
      echo "GPU_BUNDLE_ALLOW_NO_DRIVER=1 runs $name anyway (its CUDA calls then fail; GPU tests skip)."
    } >&2
    exit 127
  fi
  echo "run.sh: warning: no libcuda.so.1 (GPU_BUNDLE_ALLOW_NO_DRIVER=1): CUDA calls will fail" >&2
fi
if (( ${#needs[@]} > 0 && ! driver_missing )) && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  echo "run.sh: warning: no /dev/nvidia* device here: CUDA may find no GPU" >&2
fi

# --- whose glibc ------------------------------------------------------------------------------
# glibc_version LOADER: "2.36" from the loader's --version ("... release version 2.36.").
glibc_version() { "$1" --version 2>/dev/null | sed -nE '1s/.*version ([0-9]+\.[0-9]+).*/\1/p'; }
host_loader=/lib64/ld-linux-x86-64.so.2
mode=${GPU_BUNDLE_LOADER:-auto}
case "$mode" in
  bundled|host) ;;
  auto)
    mode=bundled
    if [[ -x "$host_loader" ]]; then
      ours=$(glibc_version "$loader"); theirs=$(glibc_version "$host_loader")
      if [[ -n "$ours" && -n "$theirs" && "$theirs" != "$ours" &&
            "$(printf '%s\n%s\n' "$ours" "$theirs" | sort -V | tail -1)" == "$theirs" ]]; then
        mode=host
      fi
      say "glibc: bundled ${ours:-?}, host ${theirs:-?}: the $mode one"
    fi ;;
  *) die "GPU_BUNDLE_LOADER must be auto, bundled or host, not '$mode'" ;;
esac
[[ "$mode" == bundled || -x "$host_loader" ]] ||
  die "GPU_BUNDLE_LOADER=host, but this machine has no $host_loader"

# host_has_versions SONAME PREFIX: the host's SONAME (from its loader cache) has the newest
# PREFIX symbol version (GLIBCXX_3.4., GCC_) of the bundled one.
host_has_versions() {
  local so=$1 prefix=$2 newest host
  newest=$(grep -aoE "${prefix//./\\.}[0-9.]*[0-9]" "$bundle/lib/$so" | sort -V | tail -1)
  host=$( (/sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null) |
    awk -v s="$so" '$1 == s && /x86-64/ { print $NF; exit }')
  [[ -n "$newest" && -n "$host" ]] && grep -aq "$newest" "$host"
}

# --- the library path -------------------------------------------------------------------------
libpath=$bundle/lib
if [[ "$mode" == host ]]; then
  # The bundled libraries but glibc's (and the C++ runtime's where the host's will do), as
  # links in a private folder.
  ours_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle_lib.XXXXXX")
  skip_cxx=0
  if host_has_versions libstdc++.so.6 GLIBCXX_3.4. && host_has_versions libgcc_s.so.1 GCC_; then
    skip_cxx=1
  fi
  for f in "$bundle"/lib/*; do
    case "$(basename "$f")" in
      ld-linux-*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|\
      libanl.so.*|libutil.so.*|libnss_*|libmvec.so.*|libBrokenLocale.so.*) continue ;;
      libstdc++.so.*|libgcc_s.so.*) (( skip_cxx )) && continue ;;
    esac
    ln -s "$f" "$ours_dir/"
  done
  libpath=$ours_dir
  loader=$host_loader
  say "the host's glibc; C++ runtime: $( (( skip_cxx )) && echo "the host's" || echo "the bundled one")"
fi
# CUDA folders go in whole, except system folders (they also hold the host's glibc, which must
# never mix with the bundled one, and its C++ runtime): their CUDA libraries are linked into a
# private folder.
is_system_dir() {
  case "$(readlink -f "$1")" in
    /lib|/lib64|/usr/lib|/usr/lib64|/lib/x86_64-linux-gnu|/usr/lib/x86_64-linux-gnu) return 0 ;;
  esac
  return 1
}
links=""
declare -A added=()
for so in "${needs[@]}"; do [[ -z "${found[$so]:-}" ]] || say "$so: ${found[$so]}/$so"; done
# In the order the folders were searched, so the loader picks what the search found.
for d in "${searched[@]}"; do
  [[ "$d" != "("* && -z "${added[$d]:-}" ]] || continue
  added[$d]=1
  here=()
  for so in "${needs[@]}"; do [[ "${found[$so]:-}" != "$d" ]] || here+=("$so"); done
  (( ${#here[@]} > 0 )) || continue
  if ! is_system_dir "$d"; then
    libpath+=":$d"
    continue
  fi
  if [[ -z "$links" ]]; then
    links=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle_cuda.XXXXXX")
    libpath+=":$links"
  fi
  for so in "${here[@]}"; do
    # The library, its siblings (libcudnn_*.so.9) and, for the driver, what it dlopen()s.
    for f in "$d/${so%%.so*}"*.so*; do [[ ! -e "$f" ]] || ln -sf "$f" "$links/"; done
    if [[ "$so" == libcuda.so.1 ]]; then
      for f in "$d"/libnvidia-*.so* "$d"/libcudadebugger.so*; do [[ ! -e "$f" ]] || ln -sf "$f" "$links/"; done
    fi
  done
done
say "library path: $libpath"

# --- Bazel's test environment, for binaries with data files -----------------------------------
if [[ -d "$bin.runfiles" ]]; then
  export RUNFILES_DIR=$bin.runfiles TEST_SRCDIR=$bin.runfiles TEST_WORKSPACE=${TEST_WORKSPACE:-fsdp}
fi
if [[ "$name" == *_test && -z "${TEST_TMPDIR:-}" ]]; then
  TEST_TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
  export TEST_TMPDIR
fi

if [[ "${GPU_BUNDLE_PRINT_COMMAND:-0}" == 1 ]]; then
  words=(env)
  [[ -z "${RUNFILES_DIR:-}" ]] ||
    words+=("RUNFILES_DIR=$RUNFILES_DIR" "TEST_SRCDIR=$TEST_SRCDIR" "TEST_WORKSPACE=$TEST_WORKSPACE")
  [[ -z "${TEST_TMPDIR:-}" ]] || words+=("TEST_TMPDIR=$TEST_TMPDIR")
  printf '%s\n' "${words[@]}" "$loader" --library-path "$libpath" "$bin" "$@"
  exit 0
fi
exec "$loader" --library-path "$libpath" "$bin" "$@"
