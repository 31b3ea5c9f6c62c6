"""What a cubin says, read from its ELF without a GPU: the SM architecture it was compiled for, and per kernel
its instruction count and the parameter layout it was compiled with.

A cubin is a 64-bit ELF. ``.text.<kernel>`` holds the kernel's machine code (128-bit instructions since Volta);
``.nv.info.<kernel>`` a list of attributes, one EIATTR_KPARAM_INFO record a parameter: ordinal, byte offset
and size (bits 18-31 of its last word). The runtime compares those layouts with the declarations of the sources
it launches with (kernels/declarations.py), so a bundle compiled from other kernel sources is refused at load
instead of launched with arguments in the wrong places.
"""
from __future__ import annotations

import struct

EIFMT_SVAL = 0x04  # an attribute with a 16-bit length and a payload; every other format: 4 bytes in all
EIATTR_KPARAM_INFO = 0x17
ELF64 = b"\x7fELF\x02"
EM_CUDA = 190  # e_machine of a CUDA ELF
SIZES = {"ptr": 8, "int32": 4, "float32": 4, "uint64": 8}  # kernel parameter kinds (kernels/cuda_source.py)

ParamLayout = tuple[tuple[int, int], ...]  # (byte offset, size) by ordinal


def sm_number(cubin: bytes) -> int | None:
    """The SM number (90 for sm_90) in a cubin's ELF header, or None if it is not a 64-bit CUDA ELF. With ELF ABI
    version >= 8 (CUDA 12.8+) bits 8..15 of e_flags hold it (0x5a = sm_90), before that bits 0..7 did."""
    if len(cubin) < 52 or cubin[:5] != ELF64:
        return None
    (machine,) = struct.unpack_from("<H", cubin, 18)
    (flags,) = struct.unpack_from("<I", cubin, 48)
    if machine != EM_CUDA:
        return None
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


def sections(cubin: bytes) -> dict[str, bytes]:
    """Every section by name ({} for bytes that are no well-formed 64-bit ELF: left to the loader to refuse)."""
    if cubin[:5] != ELF64:
        return {}
    try:
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        header = lambda i: struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize)  # noqa: E731
        names = header(shstrndx)[4]
        out = {}
        for i in range(shnum):
            name_off, _, _, _, offset, size = header(i)[:6]
            name = cubin[names + name_off:cubin.index(b"\0", names + name_off)].decode()
            out[name] = cubin[offset:offset + size]
        return out
    except (struct.error, ValueError, OverflowError, UnicodeDecodeError):
        return {}


def instructions(cubin: bytes) -> dict[str, int]:
    """Machine instructions per kernel function: its ``.text.<function>`` section size / 16."""
    return {name[len(".text."):]: len(data) // 16 for name, data in sections(cubin).items()
            if name.startswith(".text.")}


def param_layouts(cubin: bytes) -> dict[str, ParamLayout]:
    """Per kernel function, its parameters' (offset, size) in ordinal order, from ``.nv.info.<function>``."""
    out = {}
    for name, data in sections(cubin).items():
        if not name.startswith(".nv.info."):
            continue
        params, i = {}, 0
        while i + 2 <= len(data):
            fmt, attr = data[i], data[i + 1]
            if fmt == EIFMT_SVAL:
                if i + 4 > len(data):
                    break  # a truncated record: the layout stays as read so far
                length, = struct.unpack_from("<H", data, i + 2)
                payload, i = data[i + 4:i + 4 + length], i + 4 + length
                if attr == EIATTR_KPARAM_INFO and len(payload) >= 12:
                    ordinal, offset = struct.unpack_from("<HH", payload, 4)
                    flags, = struct.unpack_from("<I", payload, 8)
                    params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
            else:
                i += 4
        out[name[len(".nv.info."):]] = tuple(params[k] for k in sorted(params))
    return out


def declared_layout(kinds: list[str]) -> ParamLayout:
    """(offset, size) of parameters of these kinds, each at the next multiple of its size (the C ABI)."""
    out, end = [], 0
    for kind in kinds:
        size = SIZES[kind]
        offset = -(-end // size) * size
        out.append((offset, size))
        end = offset + size
    return tuple(out)
