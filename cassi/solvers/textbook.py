"""A textbook GAP-TV, written the way research code usually is: the baseline of
scripts/benchmark_solvers.py and a reference for the tests. Not used by the library.

Plain PyTorch, integer step S only: per-band shift loops with fresh tensors, Φ = Σ_c shift(M²)
recomputed inside every data step, Chambolle's TV iteration with fresh tensors each time.
Same mathematics as ``GAPTV(accelerate=True, step=1)``:

    y_k = y_{k−1} + (y − A v);  x = v + Aᵀ((y_k − A v) ⊘ Φ);  v = TV_denoise(x, w_k)
"""
import torch


def shift(x, step):
    """(B, C, H, W) -> (B, C, H, W + (C−1)·step): band c moved right by c·step."""
    B, C, H, W = x.shape
    out = torch.zeros(B, C, H, W + (C - 1) * step, dtype=x.dtype)
    for c in range(C):
        out[:, c, :, c * step:c * step + W] = x[:, c]
    return out


def shift_back(y, bands, step):
    """(B, 1, H, W + (C−1)·step) -> (B, C, H, W): the window of every band."""
    W = y.shape[-1] - (bands - 1) * step
    return torch.stack([y[:, 0, :, c * step:c * step + W] for c in range(bands)], dim=1)


def A(x, mask, step):
    return shift(x * mask, step).sum(dim=1, keepdim=True)


def At(y, mask, step, bands):
    return shift_back(y, bands, step) * mask


def phi_sum(mask, bands, step):
    """Φ = Σ_c shift(M²), with 1 where Φ = 0 (recomputed at every use, as research code does)."""
    phi = shift((mask * mask).expand(-1, bands, -1, -1), step).sum(dim=1, keepdim=True)
    phi[phi == 0] = 1
    return phi


def tv_denoise(f, weight, iters, tau=0.25):
    """Chambolle (2004): argmin_u ½‖u − f‖² + weight·TV(u), isotropic TV of every band."""
    def div(p1, p2):
        d1 = torch.cat([p1[..., :1, :], p1[..., 1:, :] - p1[..., :-1, :]], dim=-2)
        d2 = torch.cat([p2[..., :1], p2[..., 1:] - p2[..., :-1]], dim=-1)
        return d1 + d2

    p1 = torch.zeros_like(f)
    p2 = torch.zeros_like(f)
    for _ in range(iters):
        z = div(p1, p2) - f / weight
        g1 = torch.cat([z[..., 1:, :] - z[..., :-1, :], torch.zeros_like(z[..., :1, :])], dim=-2)
        g2 = torch.cat([z[..., 1:] - z[..., :-1], torch.zeros_like(z[..., :1])], dim=-1)
        denom = 1 + tau * torch.sqrt(g1 ** 2 + g2 ** 2)
        p1 = (p1 + tau * g1) / denom
        p2 = (p2 + tau * g2) / denom
    return f - weight * div(p1, p2)


def gap_tv(y, mask, step, weights, tv_iters):
    """Accelerated GAP-TV from x_0 = Aᵀ(y ⊘ Φ); one iteration per entry of ``weights``.

    y (B, 1, H, W'), mask (H, W) or (B, 1, H, W); returns (B, C, H, W) with C from the width.
    """
    mask = mask if mask.ndim == 4 else mask[None, None]
    C = (y.shape[-1] - mask.shape[-1]) // step + 1
    x = At(y / phi_sum(mask, C, step), mask, step, C)
    y1 = y.clone()
    for w in weights:
        yb = A(x, mask, step)
        y1 = y1 + (y - yb)
        x = x + At((y1 - yb) / phi_sum(mask, C, step), mask, step, C)
        x = tv_denoise(x, w, tv_iters)
    return x
