"""What the family modules share: the causal decay matrices of a ReplaySSM segment."""

from __future__ import annotations

import torch


def decay_matrices(la: torch.Tensor):
    """Cumulative log-decay ``Lc (m,S,H)`` and ``D[s,h,t,j] = Lc_t - Lc_j`` masked to j <= t."""
    Lc = torch.cumsum(la, 0)
    Lh = Lc.permute(1, 2, 0)
    D = Lh[..., :, None] - Lh[..., None, :]
    m = la.shape[0]
    causal = torch.ones(m, m, dtype=torch.bool, device=D.device).tril()
    ninf = torch.tensor(float("-inf"), dtype=D.dtype, device=D.device)
    return Lc, torch.where(causal, D, ninf)
