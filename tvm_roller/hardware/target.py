"""Targets: a ``tvm.target.Target`` from whatever the user gave, completed from the host.

The one place a target is normalised: :func:`complete_target` (``normalize_target`` and
``target_completion_notes`` are its two halves). It runs once at the edge of each call into
roller (``planner.Context.make``, a command's ``--target``); everything below takes the
``Target`` it made. An llvm target without ``mcpu`` / ``num-cores`` gets the host's (TVM 0.27
reads a bare ``"llvm"`` as SSE-only code); other kinds are left as TVM made them.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Any, Dict, List, Tuple, Union

from tvm.target import Target

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.ffi import plain
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware.cpu import arch_of, host_cpu, host_physical_cores, host_triple
from tvm_roller.hardware.host_name import host_cpu_name


_LIST_OPTS = {"mattr", "keys", "libs", "cl-opt"}


def _parse_cli(text: str) -> Dict[str, Any]:
    """'llvm -mcpu=x -num-cores=4 -mattr=+avx2,+fma' -> dict; anything fancier is refused."""
    try:
        tokens = shlex.split(text)
    except ValueError as err:
        raise UnsupportedError(f"cannot parse target string {text!r}: {err}") from None
    kind, flags = tokens[0], tokens[1:]
    if not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
        raise UnsupportedError(f"cannot parse target string {text!r}: {kind!r} is not a target kind")
    out: Dict[str, Any] = {"kind": kind}
    for flag in flags:
        m = re.fullmatch(r"--?([A-Za-z][A-Za-z0-9_-]*)=([^\s=]+)", flag)
        if not m or m.group(1) == "host":
            raise UnsupportedError(
                f"cannot convert the old CLI target string {text!r} (at {flag!r}); TVM 0.27 needs the "
                'dict form, e.g. {"kind": "llvm", "mcpu": "znver4", "num-cores": 8}')
        key, val = m.group(1), m.group(2)
        if key in _LIST_OPTS:
            out[key] = val.split(",")
        elif re.fullmatch(r"-?\d+", val):
            out[key] = int(val)
        else:
            out[key] = val
    return out


def _make(spec: Union[Dict[str, Any], str], original: Any) -> Target:
    try:
        return Target(spec)
    except ValueError as err:  # TVM reports bad kinds/options as ValueError
        raise UnsupportedError(f"invalid target {original!r}: {err}") from None


def _complete(target: TargetLike) -> Tuple[Target, List[str]]:
    # the one place a target is normalised (tests count the calls)
    notes: List[str] = []
    if isinstance(target, Target):
        tgt = target
    elif isinstance(target, dict):
        tgt = _make(target, target)
    elif isinstance(target, str):
        s = target.strip()
        if s.startswith("{"):
            try:
                spec = json.loads(s)
            except json.JSONDecodeError as err:
                raise UnsupportedError(f"target JSON string does not parse: {err}") from None
            tgt = _make(spec, target)
        elif re.search(r"(^|\s)-", s):
            spec = _parse_cli(s)
            notes.append(f"old CLI target string {s!r} read as {json.dumps(spec)}")
            tgt = _make(spec, target)
        else:
            tgt = _make(s, target)  # a kind name ("llvm") or a tag ("nvidia/nvidia-h100")
    else:
        raise UnsupportedError(f"cannot make a TVM target from a {type(target).__name__}")

    if tgt.kind.name != "llvm":
        return tgt, notes  # other kinds are the caller's business; never touched here

    spec = plain(tgt.export())
    changed = False
    triple = spec.get("mtriple")
    cross = bool(triple) and arch_of(str(triple)) != arch_of(host_triple())
    mcpu = spec.get("mcpu")
    if not mcpu or mcpu == "native":
        if cross:
            notes.append(f"mcpu was not given and mtriple {triple} is not the host's "
                         f"({host_triple()}): left to LLVM's generic CPU")
        else:
            spec["mcpu"] = host_cpu()
            changed = True
            how = "was not given" if not mcpu else "was 'native' (LLVM rejects it)"
            notes.append(f"mcpu {how}: completed from the host as {spec['mcpu']}")
            if host_cpu_name().reason:
                notes.append(host_cpu_name().reason)
    if not spec.get("num-cores"):
        if cross:
            notes.append("num-cores was not given for a cross target: left unset "
                         "(device models use the ISA preset's core count)")
        else:
            spec["num-cores"] = host_physical_cores()
            changed = True
            notes.append(f"num-cores was not given: completed from the host as {spec['num-cores']} "
                         "physical cores")
    if changed:
        tgt = _make(spec, target)
    return tgt, notes


def complete_target(target: TargetLike) -> Tuple[Target, List[str]]:
    """(the ``Target``, notes of what was completed or reinterpreted) from a Target, dict, JSON
    string, tag / kind string or simple old CLI string; an llvm target gets ``mcpu`` and
    ``num-cores`` from the host when missing. UnsupportedError for what is no target."""
    return _complete(target)


def normalize_target(target: TargetLike) -> Target:
    """The ``Target`` of :func:`complete_target`."""
    return _complete(target)[0]


def target_completion_notes(target: TargetLike) -> List[str]:
    """What :func:`normalize_target` fills in or reinterprets for this (original) target; []
    when nothing is completed."""
    return _complete(target)[1]


#: the target of the machine roller runs on, before completion: what a function given no
#: target plans for (made into a Context, the one normalisation, at the edge)
HOST_TARGET = "llvm"


def host_target() -> Target:
    """The target of the machine roller runs on (an llvm target completed from the host): the
    default wherever a command or function is given none."""
    return normalize_target(HOST_TARGET)
