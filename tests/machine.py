"""``python -m tests.machine``: one line naming the CPU the suite runs on and the
instruction sets that pick XLA's CPU kernels (``make test`` prints it first, so that a
red run names its machine: bfloat16 matmuls run other kernels with AMX than without)."""

import os
import pathlib
import platform

# the flags of /proc/cpuinfo that change which matmul kernels XLA's CPU backend runs
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def describe(cpuinfo: str) -> str:
    """'<model>, <n> CPUs, <flag> yes/no ...' from the text of /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    listed = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in FLAGS)
    return f"{model}, {os.cpu_count()} CPUs; {listed}"


if __name__ == "__main__":
    path = pathlib.Path("/proc/cpuinfo")
    print("machine:", describe(path.read_text() if path.exists() else ""))
