"""External repositories of the project, all local (no network).

Another Bazel workspace that uses this one calls, in its WORKSPACE:

    local_repository(name = "fsdp", path = "/path/to/this/repo")
    load("@fsdp//:repositories.bzl", "fsdp_repositories")
    fsdp_repositories(fsdp_path = "/path/to/this/repo")

(both paths absolute, or relative to that workspace's root, as
examples/external_workspace/WORKSPACE gives them).
"""

def fsdp_repositories(fsdp_path = None):
    """Declares the local repositories Bazel 4 and the project need.

    Args:
      fsdp_path: path of this repository when called from another workspace
        (absolute, or relative to that workspace's root); None when called from this repository's own WORKSPACE.
    """
    base = (fsdp_path + "/") if fsdp_path else ""
    stand_ins = base + "third_party/bazel/"

    # Bazel 4.2.3 asks for these even for a plain cc_test; small local
    # stand-ins re-export the native rules (see NOTES-bazel-offline.md).
    if not native.existing_rule("rules_cc"):
        native.local_repository(name = "rules_cc", path = stand_ins + "rules_cc")
    if not native.existing_rule("rules_java"):
        native.local_repository(name = "rules_java", path = stand_ins + "rules_java")
    if not native.existing_rule("remote_coverage_tools"):
        native.local_repository(
            name = "remote_coverage_tools",
            path = stand_ins + "remote_coverage_tools",
        )
    if not native.existing_rule("platforms"):
        native.local_repository(
            name = "platforms",
            path = "/usr/share/bazel/tools/platforms",  # Debian's bazel-platforms
        )

    # CUDA toolkit (nvcc, cudart, cuBLAS/cuBLASLt, cuDNN, NCCL).
    if not native.existing_rule("cuda"):
        native.new_local_repository(
            name = "cuda",
            path = "/usr/local/cuda",
            build_file = "@fsdp//third_party/cuda:cuda.BUILD" if fsdp_path else "//third_party/cuda:cuda.BUILD",
        )
