"""What the Triton kernels run of a config: whether they can (:func:`unsupported_reason`), each
scheme as the kernels' slot and error-feedback codes and block size, and the schemes' launches
(:func:`launch_groups`). The Triton engine's host driver (``engines.triton``) and the models'
Triton scan (``models.scan_triton``) both build their launches from these."""

from __future__ import annotations

from precsim import formats as pf

from ..config import Config, ef_fmt
from ..errors import PrecsimError
from ..families import get_family

# the replay buffer's dtype as the kernels' BUF code
BUF_IDS = {"fp32": 0, "fp64": 0, "bf16": 1, "fp16": 2}


def scheme_code(s) -> int:
    """A SchemeConfig as the kernels' slot code (``precsim.kernels.codes``)."""
    from precsim.kernels.codes import KINDS, pack
    from precsim.kernels.quant import IEEE, SR, fmt_id

    rnd = SR if s.rounding == "sr" else 0
    return pack(KINDS[s.kind], fmt_id(s.fmt), fmt_id(s.read_fmt) if s.kind == "split" else 0,
                rnd, IEEE if s.overflow == "ieee" else 0,
                pf.sr_bits_used(s.fmt, s.sr_bits) if rnd else 0)


def ef_code(s) -> int:
    """The kernels' error-feedback code of a SchemeConfig: its residual's format id + 1, 0 off."""
    from precsim.kernels.quant import fmt_id

    ef = ef_fmt(s)
    return fmt_id(ef) + 1 if ef else 0


def scheme_block(s) -> int:
    """Block size a scheme's tiles need (0: any); raises PrecsimError on two different blocks."""
    from precsim.kernels.quant import block_of

    blocks = {block_of(f) for f in (s.fmt, s.read_fmt, ef_fmt(s)) if f} - {0}
    if len(blocks) > 1:
        raise PrecsimError(f"scheme {s.kind}({s.fmt}, read {s.read_fmt}) mixes block sizes "
                           f"{sorted(blocks)}")
    return blocks.pop() if blocks else 0


def _mamba2_inputs(inp: dict, H: int, u_master: bool) -> dict:
    return dict(dt=inp["dt"], a64=inp["_a64"], a32=inp["_a32"], dA32=inp["_dA32"], x=inp["x"],
                B=inp["B"], C=inp["C"], heads=H)


def _gdn_inputs(inp: dict, H: int, u_master: bool) -> dict:
    return dict(a64=inp["_a64"], a32=inp["_a32"], g32=inp["_dA32"], beta=inp["beta"],
                q=inp["q"], k=inp["k"], v=inp["v"], u_master=u_master)


# a kernel set's launch inputs from a window's (inputs, heads, u from the master), by ``KERNEL``
LAUNCH_INPUTS = {"mamba2": _mamba2_inputs, "gdn": _gdn_inputs}


def _pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def unsupported_reason(cfg: Config) -> str | None:
    """Why the Triton engine cannot run ``cfg`` (None if it can)."""
    r, m = cfg.replay, cfg.model
    if cfg.run.compute_dtype != "fp32":
        return f"run.compute_dtype={cfg.run.compute_dtype} (kernels compute in fp32)"
    fam = get_family(m.family)
    if fam.KERNEL not in LAUNCH_INPUTS:
        return f"model.family={m.family} (no Triton kernels)"
    if fam.DELTA_RULE and r.gdn_u_source not in ("read", "master"):
        return f"replay.gdn_u_source={r.gdn_u_source}"
    two_level = any(pf.get(f).kind == "block" and getattr(pf.get(f), "two_level", False)
                    for s in cfg.schemes.values() for f in (s.fmt, s.read_fmt) if f)
    if two_level and cfg.formats.tensor_scope == "tensor":
        return "formats.tensor_scope=tensor (an NVFP4 scale over the whole layer couples heads)"
    if cfg.formats.sr_source != "hash":
        return f"formats.sr_source={cfg.formats.sr_source} (the kernels' SR uses the hash)"
    if cfg.formats.rotate:
        return "formats.rotate=true (no Hadamard rotation in the kernels)"
    P, N = m.head_dim, m.state_dim
    if not (_pow2(P) and _pow2(N) and P >= 16 and N >= 16):
        return f"head_dim={P}, state_dim={N} (kernels need powers of two >= 16)"
    for name, s in cfg.schemes.items():
        try:
            scheme_block(s)
        except PrecsimError as e:
            return f"{name}: {e}"
    return None


def launch_groups(codes: list[int], blocks: list[int], lanes: bool = False
                  ) -> list[tuple[int, list[int]]]:
    """Schemes per launch: (block, indices), at most MAX_SLOTS each, one block size each.
    ``lanes``: the truth alone first, then one scheme per launch (``engines.triton.LANES``); the
    schemes' storage order is the same either way."""
    from precsim.kernels.codes import MAX_SLOTS

    if lanes and codes:
        fused = launch_groups(codes, blocks)
        return [(fused[0][0], []), *((b, [i]) for b, idx in fused for i in idx)]

    by_blk: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        by_blk.setdefault(b, []).append(i)
    anyb = by_blk.pop(0, [])
    if not by_blk:
        by_blk[16] = []
    first = min(by_blk)
    by_blk[first] = anyb + by_blk[first]
    out = []
    for b, idx in sorted(by_blk.items()):
        for k in range(0, max(len(idx), 1), MAX_SLOTS):
            out.append((b, idx[k:k + MAX_SLOTS]))
    return out
