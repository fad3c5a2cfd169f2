"""The exported functions of an ELF file (its `.dynsym`), to call them by address in another process.

Only what the injection needs: the dynamic symbol table of a 64-bit little-endian ELF (x86-64,
aarch64) and the virtual address of its first loadable segment, read with `struct` from the
file the target has mapped. No debug information is read: gdb reading it while the target is
stopped would hold the target for hundreds of milliseconds.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

ET_EXEC = 2
SHT_DYNSYM = 11
PT_LOAD = 1
_STT_FUNC = 2
_STT_GNU_IFUNC = 10


class ElfError(Exception):
    """Not an ELF file latprof can read (the message says why)."""


class Symbols:
    """The defined function symbols of one ELF file: name -> address relative to its load base."""

    def __init__(self, path: str, functions: dict[str, int], first_load_vaddr: int, is_executable: bool) -> None:
        self.path = path
        self.functions = functions
        #: The lowest virtual address of a PT_LOAD segment (where the file's offset 0 lands).
        self.first_load_vaddr = first_load_vaddr
        #: ET_EXEC: a non-PIE executable whose addresses are absolute.
        self.is_executable = is_executable

    def address(self, name: str, mapped_at: int) -> int | None:
        """Where `name` is in a process that mapped this file's offset 0 at `mapped_at`; None if not exported."""
        value = self.functions.get(name)
        if value is None:
            return None
        if self.is_executable:
            return value
        return mapped_at - self.first_load_vaddr + value


def read_symbols(path: str, wanted: frozenset[str] | None = None) -> Symbols:
    """The exported functions of the ELF file at `path` (only `wanted` ones, when given)."""
    try:
        with open(path, "rb") as f:
            return _read(f, path, wanted)
    except OSError as exc:
        raise ElfError(f"{path}: {exc.strerror or exc}") from None
    except struct.error:
        raise ElfError(f"{path}: truncated ELF file") from None


def _read(f: BinaryIO, path: str, wanted: frozenset[str] | None) -> Symbols:
    ident = f.read(16)
    if ident[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
    header = f.read(48)
    (e_type, _machine, _version, _entry, e_phoff, e_shoff, _flags, _ehsize, e_phentsize, e_phnum, e_shentsize,
     e_shnum, _shstrndx) = struct.unpack("<HHIQQQIHHHHHH", header)  # fmt: skip
    first_load = None
    for i in range(e_phnum):
        f.seek(e_phoff + i * e_phentsize)
        p_type, _flags, p_offset, p_vaddr = struct.unpack("<IIQQ", f.read(24))
        if p_type == PT_LOAD and (first_load is None or p_vaddr < first_load):
            first_load = p_vaddr - p_offset
    if first_load is None:
        raise ElfError(f"{path}: no loadable segment")
    sections = []
    for i in range(e_shnum):
        f.seek(e_shoff + i * e_shentsize)
        sections.append(struct.unpack("<IIQQQQIIQQ", f.read(64)))
    functions: dict[str, int] = {}
    for _name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize in sections:
        if sh_type != SHT_DYNSYM or not sh_entsize:
            continue
        strtab = sections[sh_link]
        f.seek(strtab[4])
        strings = f.read(strtab[5])
        f.seek(sh_offset)
        table = f.read(sh_size)
        for offset in range(0, len(table) - sh_entsize + 1, sh_entsize):
            st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from("<IBBHQQ", table, offset)
            if not st_value or st_shndx == 0 or (st_info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC):
                continue
            end = strings.find(b"\0", st_name)
            name = strings[st_name:end].decode("ascii", "replace")
            if wanted is None or name in wanted:
                functions.setdefault(name, st_value)
    return Symbols(path, functions, first_load, e_type == ET_EXEC)
