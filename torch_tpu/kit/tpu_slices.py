"""GKE's TPU slice shapes: one table per TPU generation, the single source of chips per host and hosts per slice.

A Kubernetes node is one TPU VM, so a slice of `hosts` VMs needs one pod per VM, each requesting all of that VM's
chips (`google.com/tpu` = chips per host). The values are GKE's documented ones:

- v6e: cloud.google.com/tpu/docs/v6e "Supported configurations" and GKE's plan-tpus page: `ct6e-standard-1t`
  (1x1), `ct6e-standard-4t` (2x2 on one VM; 2x4 on 2 VMs; 4x4 ... 16x16, 4 chips per VM), `ct6e-standard-8t`
  (2x4 on one VM).
- v5e (v5litepod): cloud.google.com/tpu/docs/v5e and plan-tpus: `ct5lp-hightpu-1t` (1x1), `ct5lp-hightpu-4t`
  (2x2; 2x4 on 2 VMs; 4x4 ... 16x16), `ct5lp-hightpu-8t` (2x4 on one VM).
- v5p: cloud.google.com/tpu/docs/v5p "Configurations": every VM is `ct5p-hightpu-4t` (4 chips); the listed shapes
  up to 16x16x24 (6144 chips), plus GKE's general `{A}x{B}x{C}` rule for full cubes (each side a multiple of 4).
- v4: cloud.google.com/tpu/docs/v4 and plan-tpus: every VM is `ct4p-hightpu-4t` (4 chips); 2x2x1 ... 4x4x4 listed,
  larger `{A}x{B}x{C}` with each side a multiple of 4, up to the 4096-chip pod.

A topology two machine types offer (2x4 on v5e/v6e: one 8-chip VM or two 4-chip VMs) is ambiguous; the single-host
one is the default and `chips_per_host=4` picks the two-VM slice. Anything else is refused with the valid choices.
"""

from __future__ import annotations

import dataclasses
import math


class SliceError(ValueError):
    """An accelerator/topology/chips-per-host combination GKE does not offer."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One row of a generation's table: a topology on a machine type."""

    accelerator: str
    topology: str
    machine_type: str
    chips_per_host: int

    @property
    def chips(self) -> int:
        return math.prod(int(side) for side in self.topology.split("x"))

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str
    accelerator: str  # the value of the node label cloud.google.com/gke-tpu-accelerator
    dims: int
    rows: tuple[tuple[str, str, int], ...]  # (topology, machine type, chips per VM), the listed shapes
    cube_machine_type: str | None = None  # 3-D generations: machine type of the general {A}x{B}x{C} rule
    max_chips: int = 0  # the largest slice of the general rule

    def listed(self) -> list[str]:
        return list(dict.fromkeys(topology for topology, _, _ in self.rows))


def _planar_rows(machine_type: str) -> tuple[tuple[str, str, int], ...]:
    """The listed shapes of v5e and v6e, which GKE offers alike: `machine_type` formatted with the chips per VM
    (1x1 on a 1-chip VM, 2x2 on a 4-chip one, 2x4 on one 8-chip VM or two 4-chip ones, larger on 4-chip VMs)."""
    shapes = [("1x1", 1), ("2x2", 4), ("2x4", 8), ("2x4", 4)]
    shapes += [(t, 4) for t in ("4x4", "4x8", "8x8", "8x16", "16x16")]
    return tuple((topology, machine_type.format(chips), chips) for topology, chips in shapes)


GENERATIONS: tuple[Generation, ...] = (
    Generation("v6e", "tpu-v6e-slice", 2, _planar_rows("ct6e-standard-{}t")),
    Generation("v5e", "tpu-v5-lite-podslice", 2, _planar_rows("ct5lp-hightpu-{}t")),
    Generation(
        "v5p",
        "tpu-v5p-slice",
        3,
        tuple(
            (t, "ct5p-hightpu-4t", 4)
            for t in (
                "2x2x1",
                "2x2x2",
                "2x2x4",
                "2x4x4",
                "4x4x4",
                "4x4x8",
                "4x8x8",
                "8x8x8",
                "8x8x16",
                "8x16x16",
                "16x16x16",
                "16x16x24",
            )
        ),
        cube_machine_type="ct5p-hightpu-4t",
        max_chips=6144,
    ),
    Generation(
        "v4",
        "tpu-v4-podslice",
        3,
        tuple((t, "ct4p-hightpu-4t", 4) for t in ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4")),
        cube_machine_type="ct4p-hightpu-4t",
        max_chips=4096,
    ),
)

ALIASES = {"v6e": "tpu-v6e-slice", "v5e": "tpu-v5-lite-podslice", "v5litepod": "tpu-v5-lite-podslice"}
ALIASES |= {"v5p": "tpu-v5p-slice", "v4": "tpu-v4-podslice"}
BY_ACCELERATOR = {g.accelerator: g for g in GENERATIONS}


def generation(accelerator: str) -> Generation:
    """The table of a GKE accelerator label, or of its short name (v4, v5e/v5litepod, v5p, v6e)."""
    found = BY_ACCELERATOR.get(ALIASES.get(accelerator.lower(), accelerator))
    if found is None:
        known = ", ".join(f"{g.accelerator} ({g.name})" for g in GENERATIONS)
        raise SliceError(f"unknown accelerator {accelerator!r}; known: {known}")
    return found


def _sides(gen: Generation, topology: str) -> tuple[int, ...]:
    parts = topology.lower().split("x")
    if len(parts) != gen.dims or not all(p.isdigit() and int(p) > 0 for p in parts):
        example = "x".join(["2"] * gen.dims)
        raise SliceError(
            f"topology {topology!r} is not valid for {gen.accelerator}: it takes {gen.dims} dimensions like "
            f"{example!r}; offered: {', '.join(gen.listed())}"
        )
    return tuple(int(p) for p in parts)


def _cube_rule(gen: Generation, sides: tuple[int, ...]) -> bool:
    return (
        gen.cube_machine_type is not None
        and all(side % 4 == 0 for side in sides)
        and list(sides) == sorted(sides)
        and math.prod(sides) <= gen.max_chips
    )


def resolve(accelerator: str, topology: str, chips_per_host: int | None = None) -> Shape:
    """The slice shape of `topology` on `accelerator`; `chips_per_host` picks between machine types (and
    cross-checks otherwise). Raises SliceError naming the valid choices."""
    gen = generation(accelerator)
    sides = _sides(gen, topology)
    topology = "x".join(map(str, sides))
    rows = [Shape(gen.accelerator, t, m, c) for t, m, c in gen.rows if t == topology]
    if not rows and _cube_rule(gen, sides):
        rows = [Shape(gen.accelerator, topology, gen.cube_machine_type or "", 4)]
    if not rows:
        rule = (
            f", or AxBxC with A<=B<=C each a multiple of 4 up to {gen.max_chips} chips" if gen.cube_machine_type else ""
        )
        raise SliceError(
            f"topology {topology!r} is not offered for {gen.accelerator} ({gen.name}); offered: "
            f"{', '.join(gen.listed())}{rule}"
        )
    if chips_per_host is None:
        return rows[0]
    for row in rows:
        if row.chips_per_host == chips_per_host:
            return row
    offered = " or ".join(f"{r.chips_per_host} ({r.machine_type}, {r.hosts} host(s))" for r in rows)
    raise SliceError(
        f"topology {topology} on {gen.accelerator} has {offered} chip(s) per host, not {chips_per_host}; "
        f"google.com/tpu must equal the chips of one host"
    )


def ambiguous(shape: Shape) -> bool:
    """Whether another machine type offers the same topology (then the pod must pin its machine type)."""
    gen = BY_ACCELERATOR[shape.accelerator]
    return sum(1 for t, _, _ in gen.rows if t == shape.topology) > 1


def table(accelerator: str) -> list[Shape]:
    """The listed rows of a generation (for docs and tests)."""
    gen = generation(accelerator)
    return [Shape(gen.accelerator, t, m, c) for t, m, c in gen.rows]
