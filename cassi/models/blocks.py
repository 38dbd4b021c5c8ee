"""Prior networks of the unrolled models: a U-Net (GAP-Net / ADMM-Net) and a half-shuffle
transformer (DAUHST-style). Both map (B, C_in, H, W) -> (B, C_out, H, W) at any H, W: they pad
inside (replicate) to the multiple their down-sampling and windows need, and crop back.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["UNet", "ResStack", "HalfShuffleTransformer", "StageEstimator", "padded"]


def padded(x: torch.Tensor, multiple: int, fn) -> torch.Tensor:
    """fn(x padded at the bottom/right to a multiple of ``multiple``), cropped back to (H, W)."""
    H, W = x.shape[-2:]
    ph, pw = -H % multiple, -W % multiple
    if ph or pw:
        x = F.pad(x, (0, pw, 0, ph), mode="replicate")
    return fn(x)[..., :H, :W]


def _near_zero(conv: nn.Conv2d, scale: float = 0.01) -> nn.Conv2d:
    """The residual branch's last layer at ``scale`` × its default initialisation (bias 0): every prior
    starts close to the identity, so an untrained unrolled model starts close to its data steps from
    A⁺y instead of compounding K random residuals (gradients still reach every layer)."""
    with torch.no_grad():
        conv.weight.mul_(scale)
        conv.bias.zero_()
    return conv


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Residual U-Net: out = x[:, :C_out] + U(x), ``depth`` scales of two 3×3 convs, widths
    ``width``·2^s, max-pool down, 2×2 transposed-conv up, skip concatenation (the GAP-Net /
    ADMM-Net prior of the MST toolbox, without its final tanh; its last layer starts near zero). (B, C_in, H, W) -> (B, C_out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, width: int = 32, depth: int = 3):
        super().__init__()
        if depth < 1 or width < 1:
            raise ValueError(f"UNet needs depth >= 1 and width >= 1, got depth={depth}, width={width}")
        self.out_channels, self.multiple = out_channels, 2 ** (depth - 1)
        w = [width * 2**s for s in range(depth)]
        self.down = nn.ModuleList(_double_conv(cin, cout) for cin, cout in zip([in_channels, *w[:-1]], w))
        self.up = nn.ModuleList(nn.ConvTranspose2d(w[s + 1], w[s], 2, stride=2) for s in range(depth - 1))
        self.fuse = nn.ModuleList(_double_conv(2 * w[s], w[s]) for s in range(depth - 1))
        self.last = _near_zero(nn.Conv2d(w[0], out_channels, 1))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        skips, h = [], x
        for s, block in enumerate(self.down):
            h = block(h if s == 0 else F.max_pool2d(h, 2))
            skips.append(h)
        for s in reversed(range(len(self.up))):
            h = self.fuse[s](torch.cat([self.up[s](h), skips[s]], dim=1))
        return x[:, : self.out_channels] + self.last(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded(x, self.multiple, self._forward)


class ResStack(nn.Module):
    """A prior built for CPUs: plain 3×3 convolutions at half resolution. Pixel-unshuffle by 2
    (4·C_in channels), 3×3 conv to ``width``, ``depth`` residual blocks h + conv(ReLU(conv(h))), 3×3 conv
    to 4·C_out (starts near zero), pixel-shuffle; out = x[:, :C_out] + that. (B, C_in, H, W) -> (B, C_out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, width: int = 32, depth: int = 2):
        super().__init__()
        if depth < 0 or width < 1:
            raise ValueError(f"ResStack needs depth >= 0 and width >= 1, got depth={depth}, width={width}")
        self.out_channels, self.multiple = out_channels, 2
        self.head = nn.Conv2d(4 * in_channels, width, 3, padding=1)
        self.body = nn.ModuleList(nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU(inplace=True),
                                                nn.Conv2d(width, width, 3, padding=1)) for _ in range(depth))
        self.tail = _near_zero(nn.Conv2d(width, 4 * out_channels, 3, padding=1))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.head(F.pixel_unshuffle(x, 2)))
        for block in self.body:
            h = h + block(h)
        return x[:, : self.out_channels] + F.pixel_shuffle(self.tail(h), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded(x, self.multiple, self._forward)


class _HalfShuffleAttention(nn.Module):
    """Multi-head self-attention on (B, H, W, D) tokens: half the channels attend within
    w×w windows (local), the other half across windows among pixels at the same position in
    their window (shuffle: non-local). H, W must be multiples of w."""

    def __init__(self, dim: int, heads: int, window: int):
        super().__init__()
        if dim % 2 or (dim // 2) % heads:
            raise ValueError(f"attention dim {dim} must be even and dim/2 divisible by heads={heads}")
        self.heads, self.window = heads, window
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)

    def _attend(self, t: torch.Tensor) -> torch.Tensor:
        """(N, L, 3d) -> (N, L, d), multi-head attention over L tokens."""
        N, L, _ = t.shape
        q, k, v = t.reshape(N, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(N, L, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, D = x.shape
        w, nh, nw = self.window, H // self.window, W // self.window
        qkv = self.qkv(x).reshape(B, nh, w, nw, w, 3, 2, D // 2)  # (.., q/k/v, local/shuffle, d)
        local = qkv[..., 0, :].permute(0, 1, 3, 2, 4, 5, 6).reshape(B * nh * nw, w * w, -1)
        shuffle = qkv[..., 1, :].permute(0, 2, 4, 1, 3, 5, 6).reshape(B * w * w, nh * nw, -1)
        local = self._attend(local).reshape(B, nh, nw, w, w, -1).permute(0, 1, 3, 2, 4, 5)
        shuffle = self._attend(shuffle).reshape(B, w, w, nh, nw, -1).permute(0, 3, 1, 4, 2, 5)
        return self.proj(torch.cat([local.reshape(B, H, W, -1), shuffle.reshape(B, H, W, -1)], dim=-1))


class _Block(nn.Module):
    """Pre-norm transformer block on (B, H, W, D): attention + (1×1, depthwise 3×3, GELU, 1×1) FFN."""

    def __init__(self, dim: int, heads: int, window: int, expand: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _HalfShuffleAttention(dim, heads, window)
        self.ffn = nn.Sequential(nn.Conv2d(dim, dim * expand, 1), nn.GELU(),
                                 nn.Conv2d(dim * expand, dim * expand, 3, padding=1, groups=dim * expand),
                                 nn.GELU(), nn.Conv2d(dim * expand, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, D, H, W) -> (B, D, H, W)
        t = x.permute(0, 2, 3, 1)
        t = t + self.attn(self.norm1(t))
        t = t.permute(0, 3, 1, 2)
        return t + self.ffn(self.norm2(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


class HalfShuffleTransformer(nn.Module):
    """U-shaped half-shuffle transformer (DAUHST's HST prior, simplified): 3×3 embedding to
    ``dim``, ``len(blocks)`` scales (dim·2^s channels, ``blocks[s]`` blocks each, 4×4 stride-2
    conv down, 2×2 transposed conv up, 1×1 fusion of the skip), 3×3 mapping back; residual on the
    first C_out input channels. Departs from the paper: no fixed position embedding (any size),
    pads to window·2^(scales−1) inside. (B, C_in, H, W) -> (B, C_out, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int, dim: int = 28, blocks=(1, 1, 1), heads: int = 1,
                 window: int = 8):
        super().__init__()
        blocks = list(blocks)
        if not blocks or min(blocks) < 0 or window < 1:
            raise ValueError(f"HalfShuffleTransformer needs blocks per scale >= 0 and window >= 1, "
                             f"got blocks={blocks}, window={window}")
        self.out_channels, self.multiple = out_channels, window * 2 ** (len(blocks) - 1)
        dims = [dim * 2**s for s in range(len(blocks))]
        self.embed = nn.Conv2d(in_channels, dim, 3, padding=1)
        self.enc = nn.ModuleList(nn.Sequential(*[_Block(d, heads, window) for _ in range(n)])
                                 for d, n in zip(dims, blocks))
        self.down = nn.ModuleList(nn.Conv2d(d, 2 * d, 4, stride=2, padding=1) for d in dims[:-1])
        self.up = nn.ModuleList(nn.ConvTranspose2d(2 * d, d, 2, stride=2) for d in dims[:-1])
        self.fuse = nn.ModuleList(nn.Conv2d(2 * d, d, 1) for d in dims[:-1])
        self.dec = nn.ModuleList(nn.Sequential(*[_Block(d, heads, window) for _ in range(n)])
                                 for d, n in zip(dims[:-1], blocks[:-1]))
        self.mapping = _near_zero(nn.Conv2d(dim, out_channels, 3, padding=1))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h, skips = self.embed(x), []
        for s, enc in enumerate(self.enc):
            h = enc(h)
            if s < len(self.down):
                skips.append(h)
                h = self.down[s](h)
        for s in reversed(range(len(self.up))):
            h = self.dec[s](self.fuse[s](torch.cat([self.up[s](h), skips[s]], dim=1)))
        return x[:, : self.out_channels] + self.mapping(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded(x, self.multiple, self._forward)


class StageEstimator(nn.Module):
    """DAUHST's parameter estimator: 1×1 conv, ReLU, 3×3 stride-2 conv, global average pool, three
    1×1 convs, softplus: (B, C_in, H, W) -> two (B, K) tensors of positive per-stage values
    (α_k, added to Φ in the data step, and β_k, the noise level handed to the prior)."""

    def __init__(self, in_channels: int, stages: int, width: int = 32):
        super().__init__()
        self.stages = stages
        self.features = nn.Sequential(nn.Conv2d(in_channels, width, 1), nn.ReLU(inplace=True),
                                      nn.Conv2d(width, width, 3, stride=2, padding=1), nn.AdaptiveAvgPool2d(1))
        self.mlp = nn.Sequential(nn.Conv2d(width, width, 1), nn.ReLU(inplace=True), nn.Conv2d(width, width, 1),
                                 nn.ReLU(inplace=True), nn.Conv2d(width, 2 * stages, 1), nn.Softplus())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.mlp(self.features(x)).flatten(1) + 1e-6
        return p[:, : self.stages], p[:, self.stages:]
