#!/usr/bin/env bash
# gpu_bundle.sh: builds Bazel targets here for the GPU machine (CUDA 13, PyTorch, CMake, but no
# Bazel, no network, maybe an older glibc) and packs them, with every library they load except
# CUDA's, into OUT_DIR/ and OUT_DIR.tar.xz, small enough to carry with the device tool.
#
# Usage (from the repository root):
#   echo '/gpu_bundle*' >> .git/info/exclude      # once: the bundle must not travel as untracked files
#   tools/gpu_bundle.sh gpu_bundle //tensor/cuda:cast_test //dist:nccl_group_test ...
# then on the GPU machine (device tool, carry: ["gpu_bundle.tar.xz"]):
#   tar xJf gpu_bundle.tar.xz && gpu_bundle/run.sh gpu_bundle/bin/cast_test
# TARGET: cc_test / cc_binary labels, or patterns such as //tensor/cuda:all (expanded with
# `bazel query` to the cc_test and cc_binary rules they match).
# Environment:
#   GPU_BUNDLE_CONFIG        --config to build with (default: cuda). Empty: a plain CPU build in
#                            the default output base (what //tools:gpu_bundle_test checks).
#   GPU_BUNDLE_OUTPUT_BASE   Bazel output base (default: /root/.cache/bazel-cuda with cuda, the
#                            shared one of the CUDA builders here; Bazel's default otherwise).
#   GPU_BUNDLE_BAZEL_FLAGS   more build flags, split on spaces (e.g. "--dynamic_mode=off").
#   GPU_BUNDLE_BAZEL         the Bazel to run (default: ./bazelw).
#   and those of tools/gpu_bundle_collect.sh (GPU_BUNDLE_NO_TAR, GPU_BUNDLE_XZ_LEVEL).
# What the bundle holds and how run.sh finds CUDA: see tools/gpu_bundle_collect.sh and
# tools/gpu_bundle_run.sh.
set -euo pipefail

die() { echo "gpu_bundle: $*" >&2; exit 1; }

if (( $# < 2 )); then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
  die "need OUT_DIR and at least one TARGET"
fi
out=$1; shift
[[ "$out" != //* && "$out" != :* ]] || die "the first argument is OUT_DIR (a folder), not a target: $out"
[[ -f WORKSPACE && -x bazelw ]] || die "run from the repository root (no WORKSPACE / bazelw in $PWD)"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

config=${GPU_BUNDLE_CONFIG-cuda}
bazel=${GPU_BUNDLE_BAZEL:-./bazelw}
startup=()
output_base=${GPU_BUNDLE_OUTPUT_BASE:-}
[[ -n "$output_base" || -z "$config" ]] || output_base=/root/.cache/bazel-cuda
[[ -z "$output_base" ]] || startup+=("--output_base=$output_base")
flags=(-c opt)
[[ -z "$config" ]] || flags+=("--config=$config")
# shellcheck disable=SC2206  # split on spaces on purpose
[[ -z "${GPU_BUNDLE_BAZEL_FLAGS:-}" ]] || flags+=(${GPU_BUNDLE_BAZEL_FLAGS})

# Targets: expand patterns to the cc_test / cc_binary rules they name.
labels=()
for t in "$@"; do
  case "$t" in
    //*:all|//*:\*|//*/...|//...|//*:all-targets)
      mapfile -t expanded < <("$bazel" "${startup[@]}" query --noshow_progress \
        "kind('cc_(test|binary) rule', $t)" 2>/dev/null) || die "bazel query failed on $t"
      (( ${#expanded[@]} > 0 )) || die "$t names no cc_test or cc_binary"
      labels+=("${expanded[@]}") ;;
    //*) labels+=("$t") ;;
    *) die "give absolute labels (//pkg:name), not '$t'" ;;
  esac
done

echo "gpu_bundle: building ${#labels[@]} targets: $bazel ${startup[*]} build ${flags[*]}" >&2
# --symlink_prefix=/: leave the workspace's bazel-bin/ links to the default build.
"$bazel" "${startup[@]}" build "${flags[@]}" --symlink_prefix=/ -- "${labels[@]}" ||
  die "the build failed (see above)"
bin_dir=$("$bazel" "${startup[@]}" info "${flags[@]}" bazel-bin 2>/dev/null) ||
  die "bazel info bazel-bin failed"

binaries=()
for l in "${labels[@]}"; do
  l=${l#//}
  if [[ "$l" == *:* ]]; then pkg=${l%%:*}; name=${l#*:}; else pkg=$l; name=${l##*/}; fi
  b=$bin_dir/${pkg:+$pkg/}$name
  [[ -x "$b" ]] || die "//$l built no executable at $b (a library? or skipped as incompatible: GPU targets need GPU_BUNDLE_CONFIG=cuda)"
  binaries+=("$b")
done

"$here/gpu_bundle_collect.sh" "$out" "${binaries[@]}"

# Will it travel? The device tool carries the repository's tracked and untracked-not-ignored
# files plus what `carry` names, 64 MiB in all.
limit=$((64 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  repo_bytes=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } |
    xargs -0 -r du -cb 2>/dev/null | awk '$2 == "total" { s += $1 } END { print s + 0 }')
  dir_bytes=$(du -sb "$out" | cut -f1)
  tar_bytes=0
  [[ ! -f "$out.tar.xz" ]] || tar_bytes=$(stat -c %s "$out.tar.xz")
  echo "gpu_bundle: repository (tracked + untracked not ignored): $(mib "$repo_bytes")"
  for what in "$out" "$out.tar.xz"; do
    [[ -e "$what" ]] || continue
    if [[ "$(realpath -m "$what")" == "$(git rev-parse --show-toplevel)"/* ]] &&
       ! git check-ignore -q "$what"; then
      echo "gpu_bundle: WARNING: $what is inside the repository and not ignored: it travels with every device call. Run: echo '/$(basename "$out")*' >> .git/info/exclude" >&2
    fi
  done
  top=$(git rev-parse --show-toplevel)
  rel=$(realpath -m --relative-to="$top" "$out")
  if [[ "$rel" == ../* ]]; then
    echo "gpu_bundle: note: $out is outside the repository; the device tool carries only paths inside it: make the bundle there (e.g. gpu_bundle) to carry it"
    rel=$(basename "$out")
  fi
  if (( tar_bytes > 0 )); then
    total=$((repo_bytes + tar_bytes))
    verdict="fits in"; (( total <= limit )) || verdict="does NOT fit in"
    echo "gpu_bundle: carry [\"$rel.tar.xz\"]: $(mib "$total") with the repository: $verdict 64 MiB"
  fi
  total=$((repo_bytes + dir_bytes))
  verdict="fits in 64 MiB"; (( total <= limit )) || verdict="does NOT fit in 64 MiB: carry the .tar.xz"
  echo "gpu_bundle: carry [\"$rel\"]: $(mib "$total") with the repository: $verdict"
fi
name=$(basename "$out")
unpack=""
[[ ! -f "$out.tar.xz" ]] || unpack="tar xJf $name.tar.xz && "
echo "gpu_bundle: on the GPU machine: $unpack$name/run.sh $name/bin/$(basename "${binaries[0]}")"
