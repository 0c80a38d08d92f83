"""The data-movement model on a whole chain for a given order and tiles: Chimera's movement per
tensor (``DM``) and the memory usage (``MU``)."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from tvm_roller.fusion.chain_spec import Chain
from tvm_roller.fusion.problem import Problem, build_problem, evaluate, footprints, memory_use


def fused_problem(chain: Chain, extents: Optional[Dict[str, int]] = None,
                  line_bytes: int = 0) -> Problem:
    """The whole chain as one fused nest (its intermediates stay on chip)."""
    ext = chain.extents() if extents is None else extents
    free = [t.name for t in chain.intermediates()] if len(chain.ops) > 1 else []
    return build_problem(chain, chain.ops, ext, free, line_bytes)


def complete_tiles(chain: Chain, tiles: Dict[str, int]) -> Dict[str, int]:
    """A tile for every loop: its full extent where missing or untiled, clamped to the extent."""
    ext = chain.extents()
    out = {}
    for lp in chain.loops:
        t = ext[lp.name] if lp.untiled else int(tiles.get(lp.name, ext[lp.name]))
        out[lp.name] = max(1, min(t, ext[lp.name]))
    return out


def data_movement(chain: Chain, order: Sequence[str], tiles: Dict[str, int],
                  fused: bool = True) -> Dict[str, int]:
    """Bytes moved into the tile level per tensor, for a fused order and tiles (Chimera's
    ``DM(T)``). ``order`` lists loops outermost first (loops it omits are placed innermost);
    loops missing from ``tiles`` use their full extent. ``fused=False`` charges the intermediate
    like any other tensor (the same nest, but the intermediate spilled)."""
    chain.validate()
    tl = complete_tiles(chain, tiles)
    ext = chain.extents()
    full = list(order) + [lp.name for lp in chain.loops if lp.name not in order]
    full = [d for d in full if ext[d] > 1]
    free = [t.name for t in chain.intermediates()] if fused else []
    p = build_problem(chain, chain.ops, ext, free)
    dm, _, _ = evaluate(p, full, tl)
    return {t.name: int(v) for t, v in zip(p.tensors, dm)}


def memory_usage(chain: Chain, tiles: Dict[str, int]) -> int:
    """``MU = max over ops of the sum of DF`` (bytes) for these tiles."""
    tl = complete_tiles(chain, tiles)
    p = fused_problem(chain)
    return int(memory_use(p, footprints(p, tl)))
