"""FLOATER: positions from a neural ODE, injected as per-position biases of the attention projections.

Liu, Yu, Dhillon, Hsieh, "Learning to Encode Position for Transformer with Continuous Dynamical Model",
ICML 2020 (arXiv 2003.09229)::

    p(t) = p(s) + ∫_s^t h(τ, p(τ); θ) dτ,      b^(n)(t_i) = b^(n)(0) + Δb(t_i),  t_i = i·Δ

θ is shared by the blocks a flow drives, each block n has its own initial value b^(n)(0), and b^(n)(t_i) is
added to block n's q/k/v projections at position i, so h ≡ 0 with b(0) = 0 is the sinusoidal Transformer.

- ``dynamics.py``    the paper's equations (h, eq. 8; the per-position biases, eq. 12), ``FloaterDynamics``,
  ``FloaterSettings`` (the solver settings' one owner and one default), torchdiffeq's solve of h;
- ``rk4.py``         the default solve: RK4 at Δ/5 in latent coordinates with its hand-written backward;
- ``cuda_graph.py``  that solve replayed from CUDA graphs (opt-in, ``--floater-cuda-graph``);
- ``attention.py``   the position-biased q/k/v projections;
- ``flows.py``       the flows and their solve;
- ``positions.py``   a model's flows solved and cached together (training, evaluation);
- ``shared_solve.py`` one solve per update shared by its micro-batches (opt-in, ``--floater-shared-solve``);
- ``update_count.py`` the model's own count of its training updates, for loops that never call set_num_updates;
- ``scheme.py``      ``Floater``, the row of ``position_transformer`` (``fairseq_plugins/schemes.py``): its flags,
  and the binding of the flows' output to a stack's attention projections (the projection-bias slot);
- ``model.py``      FLOATER's work around a forward, in its own model and stack classes.

This file is the package's public interface: the model and the scripts import from here (the tests of a module
import that module); ``CUDA_GRAPHS`` is the process's captured solves (reset, captured_buckets, held_bytes).
"""

from .attention import (  # noqa: F401
    biased_projection,
    position_bindings,
    rows_from_padding_mask,
    step_bindings,
    token_rows,
)
from .cuda_graph import GRAPHS as CUDA_GRAPHS, graph_bucket, tape_bytes  # noqa: F401
from .dynamics import (  # noqa: F401
    DEFAULT_SETTINGS,
    FIXED_GRID_SOLVERS,
    SOLVER_NAMES,
    STEPS_PER_DT,
    FloaterDynamics,
    FloaterSettings,
    FloaterSolverError,
    solve_dtype,
    solve_on_grid,
)
from .flows import (  # noqa: F401
    MIN_CACHE,
    FloaterFlow,
    describe_overflow,
    solve_checked,
    solve_flows,
)
from .positions import FloaterPositions  # noqa: F401
from .scheme import Floater  # noqa: F401
