#!/usr/bin/env python3
"""Rewrites a CUDA source (.cu) into C++ for the CPU emulation (cuda_emu.h).

usage: transform.py IN.cu OUT.cc

Three rewrites, everything else is left to the force-included cuda_emu.h:
  K<<<grid, block, smem, stream>>>(args)
      -> ::cuda_emu::LaunchKernel(::cuda_emu::LaunchConfig(grid, block, smem, stream), "K",
             [=, emu_args = ::std::make_tuple(args)]() {
               ::std::apply([&](const auto&... a) { K(a...); }, emu_args); })
     (the arguments are evaluated once, at the launch, as on a GPU: a launch
     the emulation defers must not read its caller's variables when it runs;
     every CUDA thread calls K with its own copy of them, converted and, for a
     template kernel, deduced as nvcc would)
  extern __shared__ [__align__(N)] T name[];
      -> T* name = ::cuda_emu::DynamicShared<T>(<the enclosing kernel's address>);
     (above 48 KiB of dynamic shared memory a GPU refuses the launch unless
     cudaFuncSetAttribute raised the kernel's limit: fiber.h checks it)
  #include <cub/...>
      -> #include "third_party/cuda/emu/cub.h"
A #line directive keeps compiler messages pointing at the .cu file.
"""
import re
import sys


def _kernel_start(text: str, end: int) -> int:
    """Start of the kernel expression that ends before `end`: a name, maybe
    qualified, maybe with template arguments (`ns::Kernel<T, 4>`)."""
    i = end - 1
    while text[i].isspace():
        i -= 1
    if text[i] == ">":
        depth = 0
        while True:
            c = text[i]
            if c in ">)":
                depth += 1
            elif c in "<(":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        i -= 1
        while text[i].isspace():
            i -= 1
    while i >= 0 and (text[i].isalnum() or text[i] in "_:"):
        i -= 1
    return i + 1


def _closing_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SystemExit("transform.py: unbalanced parentheses in a kernel launch")


def _rewrite_launches(text: str) -> str:
    while True:
        lt = text.rfind("<<<")
        if lt < 0:
            return text
        gt = text.index(">>>", lt)
        paren = gt + 3
        while text[paren].isspace():
            paren += 1
        if text[paren] != "(":
            raise SystemExit("transform.py: a launch without arguments after >>>")
        close = _closing_paren(text, paren)
        start = _kernel_start(text, lt)
        kernel = text[start:lt].strip()
        config = text[lt + 3:gt]
        args = text[paren + 1:close]
        # Line breaks dropped between the kernel, <<< and ( go after the
        # launch, so later lines keep their numbers.
        dropped = "\n" * (text[start:lt].count("\n") + text[gt:paren].count("\n"))
        # The kernel's name without template arguments, for the launch census.
        name = re.sub(r"\s+", "", kernel.split("<")[0])
        text = (text[:start] + "::cuda_emu::LaunchKernel(::cuda_emu::LaunchConfig(%s), \"%s\", "
                "[=, emu_args = ::std::make_tuple(%s)]() { ::std::apply([&](const auto&... a) { "
                "%s(a...); }, emu_args); })" % (config, name, args, kernel) + text[close + 1:])
        semicolon = text.index(";", start)
        text = text[:semicolon + 1] + dropped + text[semicolon + 1:]


def _static_shared(m: "re.Match[str]") -> str:
    align, type_, name, dims = m.group(1), m.group(2).strip(), m.group(3), m.group(4).strip()
    t, key = name + "_emu_t", name + "_emu_key"
    alignment = "alignof(%s)" % t if align is None else "(%s > alignof(%s) ? %s : alignof(%s))" % (
        align, t, align, t)
    return ("using %s = %s %s; static char %s; %s& %s = *static_cast<%s*>("
            "::cuda_emu::StaticShared(&%s, sizeof(%s), %s));" % (
                t, type_, dims, key, t, name, t, key, t, alignment))


_KERNEL = re.compile(
    r"__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(")
_TEMPLATE = re.compile(r"template\s*<((?:[^<>]|<[^<>]*>)*)>\s*$")


def _template_arguments(params: str) -> str:
    """`typename T, int kD = 64, typename... Ts` -> `T, kD, Ts...`."""
    names, depth, current = [], 0, ""
    for c in params + ",":
        if c == "," and depth == 0:
            decl = current.split("=", 1)[0].strip()
            name = re.findall(r"\w+", decl)[-1]
            names.append(name + "..." if "..." in decl else name)
            current = ""
            continue
        depth += c in "<(" and 1 or (c in ">)" and -1 or 0)
        current += c
    return ", ".join(names)


def _enclosing_kernel(text: str, at: int) -> str:
    """The address of the __global__ function whose body holds `at`, as an
    expression valid inside that body (`&K` or `&K<T, kD>`)."""
    kernels = list(_KERNEL.finditer(text, 0, at))
    if not kernels:
        raise SystemExit("transform.py: extern __shared__ outside a __global__ function")
    kernel = kernels[-1]
    template = _TEMPLATE.search(text, 0, kernel.start())
    if template is None:
        return "&%s" % kernel.group(1)
    return "&%s<%s>" % (kernel.group(1), _template_arguments(template.group(1)))


def _rewrite_dynamic_shared(text: str) -> str:
    pattern = re.compile(
        r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s:]*?)\s+(\w+)\s*\[\s*\]\s*;")
    while True:
        m = pattern.search(text)
        if m is None:
            return text
        type_, name = m.group(1), m.group(2)
        text = text[:m.start()] + (
            "%s* %s = ::cuda_emu::DynamicShared<%s>(reinterpret_cast<const void*>(%s));"
            % (type_, name, type_, _enclosing_kernel(text, m.start()))) + text[m.end():]


def transform(text: str) -> str:
    text = _rewrite_launches(text)
    text = _rewrite_dynamic_shared(text)
    # A static __shared__ array becomes a reference to the block's copy of it
    # (fiber.h's StaticShared: block memory, filled with 0xff bytes when each
    # block starts, as the GPU gives each block its own), keyed by a static
    # local whose address is unique to the declaration (and instantiation).
    text = re.sub(
        r"(?<!extern )__shared__\s+(?:__align__\(\s*(\d+)\s*\)\s+)?([A-Za-z_][\w\s:]*?)\s+(\w+)\s*((?:\[[^\]]+\]\s*)+);",
        _static_shared,
        text,
    )
    text = re.sub(r"#include\s*<cub/[^>]*>", '#include "third_party/cuda/emu/cub.h"', text)
    if "<<<" in text or ">>>" in text or "extern __shared__" in text:
        raise SystemExit("transform.py: a launch or extern __shared__ declaration was not rewritten")
    for line in text.splitlines():
        code = line.split("//", 1)[0]
        if re.search(r"\b__shared__\b", code) and "::cuda_emu::StaticShared(" not in code:
            raise SystemExit("transform.py: declare one static __shared__ array per statement: " + line.strip())
    return text


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    with open(out, "w") as f:
        f.write('#line 1 "%s"\n' % src)
        f.write(transform(text))


if __name__ == "__main__":
    main()
