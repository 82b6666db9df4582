"""Slot codes: packing round-trips, and the kernels' literal decode agrees with kernels.codes."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from precsim.kernels import codes

KERNELS = Path(codes.__file__).parent


def test_pack_fields_round_trip():
    for kind, fmt, rf, rnd, ovf, srb in itertools.product(range(3), (0, 6, 26), (0, 7, 31),
                                                          (0, 1), (0, 1), (0, 5, 63)):
        c = codes.pack(kind, fmt, rf, rnd, ovf, srb)
        assert codes.fields(c) == {"kind": kind, "fmt": fmt, "read_fmt": rf, "rnd": rnd,
                                   "ovf": ovf, "srb": srb}
        assert c < 1 << codes.CODE_BITS
    with pytest.raises(ValueError):
        codes.pack(0, 32)


def _decode_lines(path: Path) -> dict[str, ast.expr]:
    """The ``NAME = <expr of CODE>`` lines of a kernel module."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        target = (node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
                  if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and any(
                isinstance(n, ast.Name) and n.id == "CODE" for n in ast.walk(node.value)):
            out[target.id] = node.value
    return out


@pytest.mark.parametrize("kernel", ["mamba2.py", "gdn.py"])
def test_kernel_decode_matches_codes(kernel):
    lines = _decode_lines(KERNELS / kernel)
    names = {"KIND": "kind", "F": "fmt", "RF": "read_fmt", "RND": "rnd", "OVF": "ovf",
             "SRB": "srb"}
    assert set(lines) == set(names)
    for vals in [(2, 15, 9, 1, 1, 63), (1, 6, 0, 0, 1, 8), (0, 26, 31, 1, 0, 17)]:
        c = codes.pack(*vals)
        want = codes.fields(c)
        for var, key in names.items():
            got = eval(compile(ast.Expression(lines[var]), kernel, "eval"), {"CODE": c})
            assert got == want[key], (kernel, var)


def _exprs(path: Path, pick) -> list[ast.expr]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if pick(node)]


@pytest.mark.parametrize("kernel", ["mamba2.py", "gdn.py"])
def test_kernel_dispatch_unpacks_launcher_packing(kernel):
    """The launcher's ``packed = sum(...)`` and the slot dispatch's ``(CODES // B**k) % B``, both
    evaluated as written in the kernel module, against known values: 20-bit slot codes packed
    side by side read as 5-hex-digit groups (0x12345, 0xABCDE, 0x00007, 0xFFFFF ->
    0xFFFFF00007ABCDE12345)."""
    path = KERNELS / kernel
    cs, want = [0x12345, 0xABCDE, 0x00007, 0xFFFFF], 0xFFFFF_00007_ABCDE_12345
    assert codes.CODE_BITS == 20 and codes.fields(0xFFFFF)["srb"] == 63  # 20 bits, all used
    (pack,) = _exprs(path, lambda n: isinstance(n, ast.Assign) and len(n.targets) == 1 and
                     getattr(n.targets[0], "id", None) == "packed")
    ns = {"codes": cs, "_CB": codes.CODE_BITS}
    assert eval(compile(ast.Expression(pack.value), kernel, "eval"), ns) == want
    (dispatch,) = _exprs(path, lambda n: isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                         and "CODES" in ast.unparse(n))
    expr = compile(ast.Expression(dispatch), kernel, "eval")
    assert [eval(expr, {"CODES": want, "k": k}) for k in range(4)] == cs


def test_dispatch_order_puts_costly_slots_first():
    conv_nvfp4_sr = codes.pack(0, 6, 0, 1)
    conv_fp32 = codes.pack(0, 0)
    split = codes.pack(2, 0, 6)
    order = codes.dispatch_order(True, [conv_fp32, split, conv_nvfp4_sr])
    slots = [(order >> (4 * k)) & 15 for k in range(4)]
    assert sorted(slots) == [0, 1, 2, 3] and slots[0] == 3 and slots[1] == 2
    ident = codes.dispatch_order(True, [conv_fp32, split], lpt=False)
    assert [(ident >> (4 * k)) & 15 for k in range(3)] == [0, 1, 2]
