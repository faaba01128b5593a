"""The in-kernel wire sensor fits the stack as the oldest supported verifier counts it.

Debian 12's 6.1 verifier rounds every frame of a call chain up to 32 bytes and refuses a
program whose deepest chain sums over 512 ("combined stack size of 3 calls is 544. Too
large"); newer kernels round less and load the same object, so the host kernel's tests
cannot see it.  Here the built object (bridge/bpf/wire.bpf.o) is read with llvm-objdump:
each function's stack is the deepest r10 offset it uses, the calls are its BPF-to-BPF
calls (src_reg 1) and the callbacks it hands bpf_loop() (an ld_imm64 of a code address:
the callback runs on top of the caller's frame), and every program's deepest chain must
fit 6.1's accounting.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache

import pytest

from santhrottle.bridge.kernel import OBJECT

pytestmark = pytest.mark.unit

STACK_MAX_BYTES = 512  # MAX_BPF_STACK
FRAME_ROUND_BYTES = 32  # 6.1's round_up(stack_depth, 32) per frame

SECTION = re.compile(r"^Disassembly of section (\S+):")
SYMBOL = re.compile(r"^([0-9a-f]+) <([A-Za-z_]\w*)>:")
INSN = re.compile(r"^\s*(\d+):\s+((?:[0-9a-f]{2}\s){8})\s*(.*)$")
RELOC = re.compile(r"R_BPF_64_32\s+(\S+)")
CODE_RELOC = re.compile(r"R_BPF_64_64\s+(\.text)\b")
STACK_SLOT = re.compile(r"r10 - (\d+)")


@dataclass
class Function:
    name: str
    section: str
    start: int  # instruction index in its section
    stack: int = 0
    calls: list[tuple[str, str | int]] = field(default_factory=list)  # (symbol|section, index)


def functions(dump: str) -> dict[str, Function]:
    out: dict[str, Function] = {}
    section, cur, pending, callback = "", None, None, None
    for line in dump.splitlines():
        if m := SECTION.match(line):
            section = m.group(1)
        elif (m := SYMBOL.match(line)) and not m.group(2).startswith("LBB"):
            cur = out[m.group(2)] = Function(m.group(2), section, int(m.group(1), 16) // 8)
        elif (m := RELOC.search(line)) and pending is not None and cur is not None:
            target, imm = m.group(1), pending[1]
            # to a section: its instruction imm + 1; to a function: that function
            cur.calls[-1] = (target, imm + 1) if target.startswith(".") else (target, 0)
            pending = None
        elif (m := CODE_RELOC.search(line)) and callback is not None and cur is not None:
            # a bpf_loop() callback: it runs on top of this frame, as a call does
            cur.calls.append((m.group(1), callback[1] // 8))
            callback = None
        elif (m := INSN.match(line)) and cur is not None:
            pc, raw, text = int(m.group(1)), m.group(2).split(), m.group(3)
            pending = None
            if s := STACK_SLOT.search(text):
                cur.stack = max(cur.stack, int(s.group(1)))
            if raw[0] == "85" and int(raw[1], 16) >> 4 == 1:  # BPF_CALL, src_reg pseudo
                imm = int.from_bytes(bytes.fromhex("".join(raw[4:8])), "little", signed=True)
                cur.calls.append((section, pc + imm + 1))  # pc-relative unless relocated
                pending = (pc, imm)
            elif raw[0] == "18":  # ld_imm64: a callback's address when relocated to code
                imm = int.from_bytes(bytes.fromhex("".join(raw[4:8])), "little", signed=True)
                callback = (pc, imm)
    return out


def resolve(fns: dict[str, Function], target: tuple[str, str | int]) -> Function:
    where, index = target
    if where in fns:
        return fns[where]
    starts = sorted((f.start, f.name) for f in fns.values() if f.section == where)
    owner = [name for start, name in starts if start <= int(index)]
    assert owner, f"a call to {where}+{index} lands in no function"
    return fns[owner[-1]]


def frame(f: Function) -> int:
    return -(-max(f.stack, 1) // FRAME_ROUND_BYTES) * FRAME_ROUND_BYTES


def deepest(fns: dict[str, Function], f: Function, seen: tuple[str, ...] = ()) -> list[Function]:
    assert f.name not in seen, f"recursion through {f.name}"
    chains = [deepest(fns, resolve(fns, c), (*seen, f.name)) for c in f.calls]
    return [f, *max(chains, key=lambda ch: sum(map(frame, ch)), default=[])]


@cache
def dump() -> str:
    tool = shutil.which("llvm-objdump") or shutil.which("llvm-objdump-14")
    if tool is None:
        pytest.skip("llvm-objdump not installed (Debian's llvm, with clang)")
    if not OBJECT.exists():
        pytest.skip(f"{OBJECT} not built (make bpf: clang and libbpf-dev)")
    return subprocess.run([tool, "-dr", str(OBJECT)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_every_program_fits_61s_stack_accounting() -> None:
    fns = functions(dump())
    programs = [f for f in fns.values() if f.section != ".text"]
    assert programs, "no program section in the object"
    for p in programs:
        chain = deepest(fns, p)
        total = sum(map(frame, chain))
        shown = " -> ".join(f"{f.name} ({f.stack} B, {frame(f)})" for f in chain)
        assert total <= STACK_MAX_BYTES, f"{p.name}: {shown} = {total} B > {STACK_MAX_BYTES}"


def test_the_reader_sees_the_calls() -> None:
    """The sensor hands step_cb to bpf_loop(), which calls search_at and on_pdu: a reader
    that found no call would pass the test above on any object."""
    fns = functions(dump())
    names = {resolve(fns, c).name for f in fns.values() for c in f.calls}
    assert {"step_cb", "search_at", "on_pdu"} <= names
    assert all(f.stack > 0 for f in fns.values() if f.name in names)


def test_a_chain_over_the_limit_is_caught() -> None:
    """Frames of 200, 64 and 240 bytes: 6.1 counts 224 + 64 + 256 = 544."""
    fns = {
        "prog": Function("prog", "tc", 0, 240, [(".text", 0)]),
        "walk": Function("walk", ".text", 0, 64, [(".text", 10)]),
        "pdu": Function("pdu", ".text", 10, 200),
    }
    assert [f.name for f in deepest(fns, fns["prog"])] == ["prog", "walk", "pdu"]
    assert sum(map(frame, deepest(fns, fns["prog"]))) == 544
