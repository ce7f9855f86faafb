"""``tests.machine``: the line ``make test`` prints first names the CPU and its flags."""

from tests.machine import describe

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""


def test_the_line_names_the_model_and_each_flag():
    line = describe(CPUINFO)
    assert line.startswith("Intel(R) Xeon(R) Processor, ")
    assert "amx_bf16 yes" in line and "avx512_bf16 yes" in line
    amd = describe(CPUINFO.replace("Intel(R) Xeon(R)", "AMD EPYC").replace(" amx_bf16", ""))
    assert amd.startswith("AMD EPYC Processor") and "amx_bf16 no" in amd
