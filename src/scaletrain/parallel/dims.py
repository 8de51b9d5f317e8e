"""The job's topology: parallel degrees and the named `DeviceMesh` built from them.

One object, passed explicitly (STYLE.md #4). Legality rules are not repeated here: they live in
`scaletrain.config.layout_problems` and are checked once, on construction.

Mesh axes, outermost first: ``pp, dp_replicate, dp_shard, cp, tp``. Every axis is kept, size-1
ones included, so code can always ask for ``mesh["tp"]`` and a degree of 1 is a no-op rather
than a separate branch (STYLE.md #5). tp is innermost so that its ranks are adjacent (same
node, fastest links); pp is outermost (its point-to-point traffic is the lightest).

Flattened submeshes (built by `build_mesh`):

- ``dp``          = dp_replicate x dp_shard: ranks that see different data; data loading and
                    loss averaging use it.
- ``dp_shard_cp`` = dp_shard x cp: what FSDP/ZeRO shards model states over (cp ranks hold the
                    same weights, so they may share the shards, as torchtitan does).
- ``dp_cp``       = dp_replicate x dp_shard x cp: every rank whose gradients must be averaged
                    (DDP's all-reduce group).
- ``ep``          = groups of `ep` adjacent ranks of dp_cp (expert parallelism; ep must divide
                    dp x cp, a rule of `layout_problems`).
- ``dp_shard_cp_tp`` = dp_shard x cp x tp, FSDP/ZeRO-2/3 with tp > 1 only: the norm of a 2-D
                    (FSDP x TP) gradient is reduced over it in one all-reduce.
- ``ep_replicate``= the dp x cp / ep ranks of dp_cp, `ep` apart, that hold the same experts
                    (their gradients are averaged over it; ZeRO-1 shards their states over it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scaletrain.config import Layout, ModelConfig, check_layout

__all__ = ["ParallelDims", "MESH_AXES"]

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class ParallelDims:
    """Parallel degrees of one job plus, once built, its device mesh."""

    layout: Layout
    world_size: int
    mesh: DeviceMesh | None = field(default=None, repr=False)
    _flat: dict[str, DeviceMesh] = field(default_factory=dict, repr=False)
    _fsdp_2d: DeviceMesh | None = field(default=None, repr=False)

    @classmethod
    def from_layout(
        cls, layout: Layout, world_size: int, model: ModelConfig | None = None, **check_kw
    ) -> ParallelDims:
        """Validate `layout` against the world size (and the model when given).

        `check_kw` (seq_len, global_batch, micro_batch) are forwarded to `check_layout`. Without
        a model the world-size product and the model-free composition rules are checked here.
        """
        if model is not None:
            check_layout(layout, model, world_size=world_size, **check_kw)
            return cls(layout=layout, world_size=world_size)
        from scaletrain.config import ConfigError, composition_problems

        if layout.world_size != world_size:
            raise ConfigError(
                "parallel",
                f"dp*tp*pp*cp={layout.world_size}",
                f"the degrees must multiply to the world size {world_size}",
            )
        problems = composition_problems(layout)
        if problems:
            raise problems[0]
        return cls(layout=layout, world_size=world_size)

    # --- degrees -------------------------------------------------------------------------
    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp_replicate(self) -> int:
        return self.layout.dp_replicate

    @property
    def dp_shard(self) -> int:
        return self.layout.dp_shard

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def ep(self) -> int:
        return self.layout.ep

    @property
    def sp(self) -> bool:
        return self.layout.sp and self.layout.tp > 1

    @property
    def zero(self) -> int:
        return self.layout.zero

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    # --- mesh ----------------------------------------------------------------------------
    def build_mesh(self, device_type: str = "cpu") -> DeviceMesh:
        """Create (once) the 5-axis mesh and its flattened submeshes; needs a process group."""
        if self.mesh is not None:
            return self.mesh
        mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_AXES)
        # Kept here: slicing flattened names back out of the root mesh is deprecated in torch.
        self._flat = {
            "dp": mesh["dp_replicate", "dp_shard"]._flatten("dp"),
            "dp_shard_cp": mesh["dp_shard", "cp"]._flatten("dp_shard_cp"),
            "dp_cp": mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"),
        }
        if self.zero >= 2 and self.tp > 1 and self.dp_shard * self.cp > 1:
            # FSDP + TP gradients are DTensors on (.., dp_shard_cp, tp): with this flattened
            # mesh their norm (clip_grad_norm_) is one all-reduce, not two in a row (which
            # DTensor warns about on every step); HSDP's replicas are not reduced over
            self._flat["dp_shard_cp_tp"] = mesh["dp_shard", "cp", "tp"]._flatten("dp_shard_cp_tp")
        # Expert parallel takes its ranks from dp x cp: groups of `ep` adjacent dp_cp ranks.
        dp_cp = self.layout.dp * self.cp
        ep_2d = self._flat["dp_cp"]._unflatten(
            0, (dp_cp // self.ep, self.ep), ("ep_replicate", "ep")
        )
        self._flat["ep"], self._flat["ep_replicate"] = ep_2d["ep"], ep_2d["ep_replicate"]
        # every named axis sliced now, once: a mesh sliced later inside fake mode (the
        # dry-run's step) would get a fake rank tensor and could not say which ranks it holds
        for axis in MESH_AXES:
            self._flat.setdefault(axis, mesh[axis])
        if self.dp_replicate > 1:
            self._fsdp_2d = mesh["dp_replicate", "dp_shard_cp"]
        self.mesh = mesh
        return mesh

    def _require_mesh(self) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("ParallelDims.build_mesh() must be called first")
        return self.mesh

    def submesh(self, name: str) -> DeviceMesh:
        """A named axis ("tp", "pp", ...) or a derived one ("dp", "dp_shard_cp", "dp_cp", "ep",
        "ep_replicate")."""
        mesh = self._require_mesh()
        return self._flat[name] if name in self._flat else mesh[name]

    def fsdp_mesh(self) -> DeviceMesh:
        """What FSDP shards over: 1-D (dp_shard x cp), or 2-D (dp_replicate, dp_shard x cp)
        for HSDP (sharded inside each replica group, all-reduced across groups)."""
        self._require_mesh()
        if self.dp_replicate == 1:
            return self._flat["dp_shard_cp"]
        assert self._fsdp_2d is not None
        return self._fsdp_2d

    @property
    def dp_rank(self) -> int:
        """This rank's index among the ranks that read different data (0 without a mesh)."""
        return self.submesh("dp").get_local_rank() if self.mesh is not None else 0

    @property
    def tp_rank(self) -> int:
        return self.submesh("tp").get_local_rank() if self.mesh is not None else 0

    @property
    def pp_rank(self) -> int:
        return self.submesh("pp").get_local_rank() if self.mesh is not None else 0

    @property
    def cp_rank(self) -> int:
        return self.submesh("cp").get_local_rank() if self.mesh is not None else 0

    # --- which strategies are active -----------------------------------------------------
    @property
    def fsdp_enabled(self) -> bool:
        """ZeRO-2/3 (FSDP2) over dp_shard x cp, with or without replicas (HSDP)."""
        return self.zero >= 2 and self.layout.dp * self.cp > 1

    @property
    def ddp_enabled(self) -> bool:
        """DDP (ZeRO-0) or DDP + sharded optimizer (ZeRO-1) over dp x cp."""
        return self.zero <= 1 and self.layout.dp * self.cp > 1
