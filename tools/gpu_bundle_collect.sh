#!/usr/bin/env bash
# gpu_bundle_collect.sh: packs already-built binaries, with every shared library they load
# except CUDA's, into a folder that runs on another x86-64 Linux machine (the GPU machine,
# which has CUDA 13 but not this machine's Debian libraries or Bazel), plus OUT_DIR.tar.xz.
# tools/gpu_bundle.sh builds Bazel targets and calls this; it needs no Bazel itself (the
# sh_test //tools:gpu_bundle_test runs it inside the test sandbox).
#
# Usage: tools/gpu_bundle_collect.sh OUT_DIR BINARY...
#   BINARY: an ELF executable (e.g. bazel-bin/tensor/cuda/cast_test); its Bazel runfiles
#   (BINARY.runfiles_manifest / BINARY.runfiles/) are copied when present, minus the
#   project's shared objects, which go into lib/ with the rest.
# Environment:
#   GPU_BUNDLE_RUN_SH   the run.sh to install (default: gpu_bundle_run.sh beside this script)
#   GPU_BUNDLE_NO_TAR=1 skip OUT_DIR.tar.xz
#   GPU_BUNDLE_XZ_LEVEL xz preset (default 6; 9 saves ~2% and takes longer)
#
# Layout of OUT_DIR:
#   run.sh                    run.sh BINARY [args...]: finds the host's CUDA libraries, then
#                             runs BINARY under lib/ld-linux-x86-64.so.2 with lib/ first
#   bin/NAME                  the binaries (unchanged copies)
#   bin/NAME.runfiles/        their data files, Bazel runfiles layout (only when they have any)
#   bin/NAME.ldd              `ldd` of NAME as seen on the build machine
#   bin/NAME.cuda-libs        the CUDA libraries NAME needs from the host, one soname a line
#   wrap/NAME                 a script that runs NAME through run.sh (for launchers' children)
#   lib/                      glibc + loader, libstdc++, libgcc_s, Abseil, glog, gflags, gtest,
#                             benchmark, oneDNN, OpenBLAS, Gloo, hiredis, ... and the project's
#                             own shared objects (Bazel's _solib_k8 libraries of cc_tests)
#   MANIFEST                  what was bundled, from where, when
set -euo pipefail

die() { echo "gpu_bundle_collect: $*" >&2; exit 1; }

if (( $# < 2 )); then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
  die "need OUT_DIR and at least one BINARY"
fi
out=$1; shift

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_sh=${GPU_BUNDLE_RUN_SH:-$here/gpu_bundle_run.sh}
[[ -f "$run_sh" ]] || die "run.sh template not found: $run_sh (set GPU_BUNDLE_RUN_SH)"
command -v ldd >/dev/null || die "ldd not found (Debian package libc-bin)"

# CUDA libraries: never bundled; the GPU machine must provide them (toolkit, driver, NCCL).
is_cuda_lib() {  # $1 = soname, $2 = resolved path (may be empty or "not found")
  case "$1" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libcudnn*.so*|libnccl.so*|\
    libnvrtc*.so*|libnvJitLink.so*|libcufft*.so*|libcurand.so*|libcusparse*.so*|\
    libcusolver*.so*|libcupti.so*|libnvToolsExt.so*|libnvidia-*.so*|libcufile*.so*|\
    libnvblas.so*|libnvshmem*.so*) return 0 ;;
  esac
  case "$2" in
    /usr/local/cuda*|*/site-packages/nvidia/*|*/dist-packages/nvidia/*) return 0 ;;
  esac
  return 1
}

is_elf() { [[ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" == '177ELF' ]]; }

for b in "$@"; do
  [[ -e "$b" ]] || die "no such binary: $b"
  [[ -f "$b" && -x "$b" ]] || die "not an executable file: $b"
  is_elf "$b" || die "not an ELF binary (a script?): $b"
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/wrap"
out_abs=$(cd "$out" && pwd)

declare -A bundled=()   # soname -> source path
loader=""
copy_lib() {  # $1 = name to give it in lib/, $2 = source path
  local name=$1 src=$2
  if [[ -n "${bundled[$name]:-}" ]]; then
    [[ "$(readlink -f "${bundled[$name]}")" == "$(readlink -f "$src")" ]] ||
      echo "gpu_bundle_collect: warning: two different $name: ${bundled[$name]} and $src (keeping the first)" >&2
    return
  fi
  cp -L "$src" "$out/lib/$name"
  chmod u+w,a+r "$out/lib/$name"
  bundled[$name]=$src
}

for b in "$@"; do
  name=$(basename "$b")
  [[ ! -e "$out/bin/$name" ]] || die "two binaries named $name: give each target once"
  cp -L "$b" "$out/bin/$name"
  chmod u+w,a+rx "$out/bin/$name"

  ldd_out=$(ldd "$b" 2>&1) || die "ldd failed on $b: $ldd_out"
  [[ "$ldd_out" != *"not a dynamic executable"* ]] || die "$b is static: nothing to bundle but itself (not supported: run.sh expects a dynamic binary)"
  printf '%s\n' "$ldd_out" > "$out/bin/$name.ldd"
  : > "$out/bin/$name.cuda-libs"

  while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}
    [[ -n "$line" ]] || continue
    if [[ "$line" == *" => "* ]]; then
      soname=${line%% => *}
      rest=${line#* => }
      path=${rest%% (*}
    else
      # "linux-vdso.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
      path=${line%% (*}
      soname=$(basename "$path")
    fi
    case "$soname" in linux-vdso.so.*|linux-gate.so.*) continue ;; esac
    if [[ "$soname" == ld-linux-x86-64.so.2 ]]; then
      loader=$path
      copy_lib ld-linux-x86-64.so.2 "$path"
      continue
    fi
    if is_cuda_lib "$soname" "$path"; then
      echo "$soname" >> "$out/bin/$name.cuda-libs"
      continue
    fi
    [[ "$path" != "not found" && -e "$path" ]] ||
      die "$b needs $soname, which ldd does not find here (and it is not a CUDA library the GPU machine provides): build it or install it first"
    copy_lib "$soname" "$path"
  done <<< "$ldd_out"

  # The driver is dlopen()ed by libcudart: needed too, never seen by ldd.
  if grep -q '^libcudart\.so' "$out/bin/$name.cuda-libs"; then
    echo libcuda.so.1 >> "$out/bin/$name.cuda-libs"
  fi
  sort -u -o "$out/bin/$name.cuda-libs" "$out/bin/$name.cuda-libs"

  # Runfiles (data files of tests and binaries), from the manifest: "<rel> <abs target>".
  manifest=""
  for m in "$b.runfiles_manifest" "$b.runfiles/MANIFEST"; do
    [[ -f "$m" ]] && { manifest=$m; break; }
  done
  if [[ -n "$manifest" ]]; then
    real_b=$(readlink -f "$b")
    while IFS= read -r entry; do
      [[ -n "$entry" ]] || continue
      rel=${entry%% *}
      target=""
      [[ "$entry" == *" "* ]] && target=${entry#* }
      case "$rel" in */_solib_*/*|_solib_*/*) continue ;; esac
      if [[ -n "$target" ]]; then
        [[ "$(readlink -f "$target")" != "$real_b" ]] || continue
        [[ -f "$target" ]] || continue
      fi
      mkdir -p "$out/bin/$name.runfiles/$(dirname "$rel")"
      if [[ -n "$target" ]]; then
        cp -L "$target" "$out/bin/$name.runfiles/$rel"
        if is_elf "$target"; then
          echo "gpu_bundle_collect: note: $name's runfile $rel is a binary: it runs with the host's loader unless started through run.sh" >&2
        fi
      else
        : > "$out/bin/$name.runfiles/$rel"
      fi
    done < "$manifest"
  fi

  cat > "$out/wrap/$name" <<EOF
#!/usr/bin/env bash
# Runs the bundled $name through run.sh (for launchers that start it as a child process).
exec "\$(cd "\$(dirname "\${BASH_SOURCE[0]}")/.." && pwd)/run.sh" $name "\$@"
EOF
  chmod a+rx "$out/wrap/$name"
done

[[ -n "$loader" ]] || die "no dynamic loader (ld-linux-x86-64.so.2) in ldd's output: is this an x86-64 glibc binary?"

# The rest of glibc that libraries loaded on the host (libcuda.so.1 and what it dlopen()s,
# NCCL, cuDNN) may ask for: they must find this glibc's pieces, never the host's.
libc_dir=$(dirname "$(readlink -f "${bundled[libc.so.6]:-/lib/x86_64-linux-gnu/libc.so.6}")")
for so in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 \
          libutil.so.1 libanl.so.1 libnss_files.so.2 libnss_dns.so.2 libgcc_s.so.1 libstdc++.so.6; do
  [[ -n "${bundled[$so]:-}" ]] && continue
  for d in "$libc_dir" /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
    if [[ -e "$d/$so" ]]; then copy_lib "$so" "$d/$so"; break; fi
  done
done

cp "$run_sh" "$out/run.sh"
chmod a+rx "$out/run.sh"

{
  echo "# gpu_bundle: made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(ldd --version | head -1)"
  echo "# binaries"
  for b in "$@"; do echo "bin/$(basename "$b") <= $(readlink -f "$b")"; done
  echo "# libraries"
  for k in $(printf '%s\n' "${!bundled[@]}" | sort); do echo "lib/$k <= $(readlink -f "${bundled[$k]}")"; done
  echo "# CUDA libraries needed from the GPU machine (not bundled)"
  cat "$out"/bin/*.cuda-libs | sort -u
} > "$out/MANIFEST"

dir_bytes=$(du -sb "$out" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu_bundle_collect: $out: $# binaries, ${#bundled[@]} libraries, $(mib "$dir_bytes") unpacked"
cuda_needed=$(cat "$out"/bin/*.cuda-libs | sort -u | tr '\n' ' ')
echo "gpu_bundle_collect: CUDA libraries the GPU machine must provide: ${cuda_needed:-none}"

if [[ "${GPU_BUNDLE_NO_TAR:-0}" != 1 ]]; then
  command -v xz >/dev/null || die "xz not found (Debian package xz-utils); or set GPU_BUNDLE_NO_TAR=1"
  tarball="$out_abs.tar.xz"
  tar -C "$(dirname "$out_abs")" -cf - "$(basename "$out_abs")" |
    xz -T2 "-${GPU_BUNDLE_XZ_LEVEL:-6}" > "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
  tar_bytes=$(stat -c %s "$tarball")
  echo "gpu_bundle_collect: $tarball: $(mib "$tar_bytes") ($tar_bytes bytes)"
fi
