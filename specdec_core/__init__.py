"""specdec_core: speculative decoding as pure JAX functions.

Glossary (the same words mean the same thing in every module of this project):

- **target** (Mp): the large model whose output distribution we must reproduce.
- **draft** (Mq): the small model that guesses the target's next tokens.
- **γ (gamma)**: the number of tokens the draft proposes per iteration.
- **propose**: the draft samples γ tokens autoregressively, returning the tokens and
  its probabilities q at each drafted position.
- **score**: the target runs one forward pass over the last committed token plus the γ
  drafted ones and returns its probabilities p at γ+1 positions.
- **verify / accept**: the rule of Leviathan et al. (2023), Algorithm 1, that keeps the
  longest prefix of drafted tokens passing ``u < p(x)/q(x)`` and emits one more token.
- **accepted** tokens: drafted tokens the rule keeps (``n_accepted`` ∈ [0, γ]).
- **recovered** token: at the first rejection, a sample from norm(max(0, p − q)).
- **bonus** token: when all γ are accepted, a sample from p at position γ+1.
- **commit**: append the accepted tokens and the recovered/bonus token to the output.
- **rollback**: set a cache's per-row ``lengths`` back to what was committed; stale K/V
  slots are masked and later overwritten (O(1)).
- **α (alpha)**: expected acceptance rate E[β], with β = Σ_x min(p(x), q(x)).
- **c**: cost coefficient, time of one draft step over one target step.

Layers: ``pipelines → workers → specdec_core``; this package imports neither Ray, Beam
nor MLflow.
"""

from specdec_core import xla_flags as _xla_flags

_xla_flags.ensure()  # before JAX's CPU backend starts: a row's bits must not depend on its batch
