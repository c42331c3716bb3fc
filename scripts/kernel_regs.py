"""Registers, and stack (spills), of each kernel in kernels.cu + flash.cu, without a GPU:
compiles the source with NVRTC as Vramroom does at run time and reads the cubin's
EIATTR_REGCOUNT and stack-size attributes. Occupancy follows from it (65,536 registers per
SM): 128 registers at 128 threads lets 4 blocks share an SM, 168 only 3.

    python3 scripts/kernel_regs.py [--arch 90] [--lib DIR] [SUBSTRING]

DIR holds libnvrtc.so.13 (default: the first of VRAMROOM_CUDA_LIB_DIRS, then .ci-cache/nvrtc/lib,
where .ci/run puts the pip wheel's copy).
"""
import ctypes
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]


def opt(name, default):
    if name in args:
        i = args.index(name)
        v = args[i + 1]
        del args[i:i + 2]
        return v
    return default


arch = opt("--arch", "90")
lib_dir = opt("--lib", (os.environ.get("VRAMROOM_CUDA_LIB_DIRS", "").split(":")[0]
                        or os.path.join(ROOT, ".ci-cache/nvrtc/lib")))
want = args[0] if args else ""

src_dir = os.path.join(ROOT, "crates/vramroom-cuda/src/compute")
src = open(os.path.join(src_dir, "kernels.cu")).read() + open(os.path.join(src_dir, "flash.cu")).read()
lib = ctypes.CDLL(os.path.join(lib_dir, "libnvrtc.so.13"))
prog = ctypes.c_void_p()
if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernels.cu", 0, None, None) != 0:
    sys.exit("nvrtcCreateProgram failed")
opts = [f"--gpu-architecture=sm_{arch}".encode(), b"-std=c++17"]
rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
n = ctypes.c_size_t()
if rc != 0:
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    sys.exit(log.value.decode())
lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
lib.nvrtcGetCUBIN(prog, buf)
b = buf.raw

# ELF64: section headers, their names, the symbol table, then the .nv.info attributes
# (format EIFMT_SVAL = 4: u8 format, u8 attribute, u16 size, u32 symbol, u32 value).
shoff = struct.unpack_from("<Q", b, 0x28)[0]
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
secs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]


def cstr(base, off):
    end = b.index(b"\0", base + off)
    return b[base + off:end].decode()


names = [cstr(secs[shstrndx][4], s[0]) for s in secs]
symtab = secs[names.index(".symtab")]
strtab = secs[symtab[6]]
syms = [cstr(strtab[4], struct.unpack_from("<I", b, symtab[4] + 24 * i)[0]) for i in range(symtab[5] // 24)]
info = secs[names.index(".nv.info")]
attrs = {0x2F: "registers", 0x12: "stack"}  # EIATTR_REGCOUNT, EIATTR_MAX_STACK_SIZE
found = {}
o, end = info[4], info[4] + info[5]
while o < end:
    fmt, attr = b[o], b[o + 1]
    size = struct.unpack_from("<H", b, o + 2)[0] if fmt == 4 else 0
    if fmt == 4 and attr in attrs:
        sym, val = struct.unpack_from("<II", b, o + 4)
        found.setdefault(syms[sym], {})[attrs[attr]] = val
    o += 4 + size
for k in sorted(found):
    if k.startswith("k_") and want in k:
        v = found[k]
        print(f"{k:24s} {v.get('registers', 0):4d} registers  {v.get('stack', 0):5d} bytes of stack")
