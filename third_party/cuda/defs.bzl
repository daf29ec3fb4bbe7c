"""cuda_library: compiles .cu files with nvcc and links them as a cc_library.

The nvcc actions see the headers, include paths and defines of the C++ deps,
so CUDA sources include project headers the same way C++ sources do. Targets
are only compatible with --config=cuda (define cuda=true); elsewhere
`bazel build //...` skips them.
"""

_CUDA_ARCHS = ["90"]  # H100 / H200 (sm_90).

def _cuda_objects_impl(ctx):
    cc_infos = [dep[CcInfo] for dep in ctx.attr.deps if CcInfo in dep]
    compilation = cc_common.merge_cc_infos(cc_infos = cc_infos).compilation_context
    include_args = []
    for path in compilation.includes.to_list() + compilation.quote_includes.to_list():
        include_args += ["-I", path]
    for path in compilation.system_includes.to_list():
        include_args += ["-isystem", path]
    define_args = ["-D" + d for d in compilation.defines.to_list()]
    arch_args = []
    for arch in _CUDA_ARCHS:
        arch_args += ["-gencode", "arch=compute_{0},code=sm_{0}".format(arch)]

    inputs = depset(ctx.files.hdrs, transitive = [compilation.headers])
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_objs/{}/{}.o".format(ctx.label.name, src.basename[:-len(src.extension) - 1]))
        args = ctx.actions.args()
        args.add_all(["-c", src.path, "-o", obj.path])
        args.add_all(["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr"])
        args.add_all(["-I", ".", "-I", ctx.bin_dir.path])
        if ctx.label.workspace_root:
            args.add_all(["-I", ctx.label.workspace_root])
        args.add_all(include_args + define_args + arch_args + ctx.attr.copts)
        # The installed nvcc by absolute path: it finds cicc, ptxas and the
        # CUDA headers relative to itself, which a symlinked copy would not.
        # Each run gets a temporary folder of its own: nvcc names its
        # temporary files by its process id ("tmpxft_<pid>_..."), and in
        # Bazel's linux-sandbox every action has its own PID namespace, so two
        # nvcc runs at once share a pid and, in the host's /tmp, each other's
        # files ("nvcc fatal : Failed to open for read host compiler
        # properties", seen in CI). The folder goes however the run ends (the
        # EXIT trap keeps nvcc's status; Bazel's SIGTERM on a cancel or
        # timeout exits through it). nvcc's path is $1, never parsed by the
        # shell.
        ctx.actions.run_shell(
            command = ("tmp=$(mktemp -d) || exit 1; trap 'rm -rf \"$tmp\"' EXIT; " +
                       "trap 'exit 143' TERM; trap 'exit 130' INT; TMPDIR=\"$tmp\" \"$@\""),
            arguments = [ctx.attr.nvcc_path, args],
            inputs = depset([src], transitive = [inputs]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc {}".format(src.short_path),
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "nvcc_path": attr.string(default = "/usr/local/cuda/bin/nvcc"),
    },
)

def nvcc_compatible():
    """target_compatible_with for targets that need the real CUDA build (--config=cuda):
    GPU benchmarks, NCCL, nvcc objects."""
    return select({
        "@fsdp//third_party/cuda:enabled": [],
        "//conditions:default": ["@platforms//:incompatible"],
    })

def cuda_compatible():
    """target_compatible_with for targets that need --config=cuda or --config=cuda_emu."""
    return select({
        "@fsdp//third_party/cuda:enabled": [],
        "@fsdp//third_party/cuda:emu": [],
        "//conditions:default": ["@platforms//:incompatible"],
    })

def emu_compatible():
    """target_compatible_with for tests of the CUDA emulation itself (--config=cuda_emu):
    what they read (third_party/cuda/emu/counters.h) a GPU does not count."""
    return select({
        "@fsdp//third_party/cuda:emu": [],
        "//conditions:default": ["@platforms//:incompatible"],
    })

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc (--config=cuda).

    With --config=cuda_emu the same sources are rewritten by
    //third_party/cuda/emu:transform.py and compiled as C++ against the CPU
    emulation (//third_party/cuda/emu), so their tests run without a GPU.
    """
    _cuda_objects(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:headers"],
        copts = copts,
        target_compatible_with = nvcc_compatible(),
        visibility = ["//visibility:private"],
    )
    emu_srcs = []
    for src in srcs:
        out = "_emu/{}/{}.cc".format(name, src.rsplit("/", 1)[-1].rsplit(".", 1)[0])
        native.genrule(
            name = "{}_emu_{}".format(name, len(emu_srcs)),
            srcs = [src],
            outs = [out],
            cmd = "python3 $(location @fsdp//third_party/cuda/emu:transform.py) $< $@",
            tools = ["@fsdp//third_party/cuda/emu:transform.py"],
            target_compatible_with = select({
                "@fsdp//third_party/cuda:emu": [],
                "//conditions:default": ["@platforms//:incompatible"],
            }),
            visibility = ["//visibility:private"],
        )
        emu_srcs.append(out)
    native.cc_library(
        name = name,
        srcs = select({
            "@fsdp//third_party/cuda:emu": emu_srcs,
            "//conditions:default": [":" + name + "_objs"],
        }),
        hdrs = hdrs,
        copts = select({
            "@fsdp//third_party/cuda:emu": [
                "-include",
                "third_party/cuda/emu/cuda_emu.h",
                "-ffp-contract=off",
                "-Wno-unknown-pragmas",
                "-Wno-unused-variable",
                "-Wno-unused-function",
            ],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "@fsdp//third_party/cuda:emu": ["@fsdp//third_party/cuda/emu:device"],
            "//conditions:default": ["@cuda//:cudart"],
        }),
        target_compatible_with = cuda_compatible(),
        visibility = visibility,
        **kwargs
    )

def cuda_enabled_select(if_cuda, if_not = [], if_emu = None):
    """select() over --config=cuda; --config=cuda_emu takes if_cuda unless if_emu is given."""
    return select({
        "@fsdp//third_party/cuda:enabled": if_cuda,
        "@fsdp//third_party/cuda:emu": if_cuda if if_emu == None else if_emu,
        "//conditions:default": if_not,
    })

def _link_only_impl(ctx):
    dep = ctx.attr.dep
    return [
        CcInfo(linking_context = dep[CcInfo].linking_context),
        DefaultInfo(runfiles = dep[DefaultInfo].default_runfiles),
    ]

_link_only = rule(
    implementation = _link_only_impl,
    attrs = {"dep": attr.label(providers = [CcInfo])},
)

def cuda_seam(name, hdrs, deps, real, stub, visibility = None):
    """A cc_library of `hdrs` (and `deps`) behind which `real` is linked with
    --config=cuda or --config=cuda_emu, and `stub` otherwise.

    Both are linked only (_link_only: a CcInfo with the linking context alone):
    their headers and include paths (CUDA's, the emulation's) do not reach the
    files that include `hdrs`, so those compile with the same command lines
    and inputs in every configuration and Bazel reuses their objects across
    configurations, as Bazel 5's implementation_deps would (with the real
    backend as a plain dependency, --config=cuda compiled the whole project
    again). `hdrs` must declare all that users of the seam include; `real` and
    `stub` implement them.
    """
    _link_only(
        name = name + "_real_linked",
        dep = real,
        target_compatible_with = cuda_compatible(),
        visibility = ["//visibility:private"],
    )
    _link_only(name = name + "_stub_linked", dep = stub, visibility = ["//visibility:private"])
    native.cc_library(
        name = name,
        hdrs = hdrs,
        deps = deps + cuda_enabled_select(
            if_cuda = [":" + name + "_real_linked"],
            if_not = [":" + name + "_stub_linked"],
        ),
        visibility = visibility,
    )
