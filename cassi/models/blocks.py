"""Prior networks of the unrolled models (GAP-Net / ADMM-Net): a U-Net and a convolutional ResStack. Both map
(B, C_in, H, W) -> (B, C_out, H, W) at any H, W: they pad inside (replicate) to the multiple their
down-sampling needs, and crop back. (DAUHST's transformer is in :mod:`cassi.models.zoo.dauhst`.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["UNet", "ResStack", "padded", "near_zero", "widen_state"]


def padded(x: torch.Tensor, multiple: int, fn) -> torch.Tensor:
    """fn(x padded at the bottom/right to a multiple of ``multiple``), cropped back to (H, W)."""
    H, W = x.shape[-2:]
    ph, pw = -H % multiple, -W % multiple
    if ph or pw:
        x = F.pad(x, (0, pw, 0, ph), mode="replicate")
    return fn(x)[..., :H, :W]


def near_zero(conv: nn.Conv2d, scale: float = 0.01) -> nn.Conv2d:
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
        self.last = near_zero(nn.Conv2d(w[0], out_channels, 1))

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


def widen_state(old: dict, new: "UNet") -> dict:
    """The state dict of ``new`` (a UNet as wide as or wider than the one of ``old``, same depth and channels in
    and out) holding ``old``'s weights: each layer's old filters and biases in its first channels (after
    ``fuse``'s concatenation, the first of each half), the old outputs reading zero from the new channels, the new
    channels keeping ``new``'s random initialisation. ``new`` then computes exactly what ``old`` computed
    (Net2Net-style widening with silent new channels), and training reaches the new channels through their
    outputs' zero weights, whose gradients are not zero."""
    state = {k: v.detach().clone() for k, v in new.state_dict().items()}
    if set(state) != set(old):
        raise ValueError(f"widen_state: the UNets differ in layers ({sorted(set(state) ^ set(old))[:3]})")
    for key, w in old.items():
        target = state[key]
        if w.dim() != target.dim() or any(a > b for a, b in zip(w.shape, target.shape)):
            raise ValueError(f"widen_state: {key} is {tuple(w.shape)}, wider than {tuple(target.shape)}")
        if w.dim() == 1:  # a bias: the old outputs first
            target[: len(w)] = w
            continue
        out_dim, in_dim = (1, 0) if key.startswith("up.") else (0, 1)  # ConvTranspose2d: (in, out, k, k)
        c_old, c_new = w.shape[in_dim], target.shape[in_dim]
        if key.startswith("fuse.") and key.endswith(".0.weight"):  # input [up (c/2), skip (c/2)]
            ins = torch.cat([torch.arange(c_old // 2), c_new // 2 + torch.arange(c_old // 2)])
        else:
            ins = torch.arange(c_old)
        rows = target.narrow(out_dim, 0, w.shape[out_dim])  # the old outputs: read nothing of the new channels
        rows.zero_()
        rows.index_copy_(in_dim, ins, w.to(target.dtype))
    return state


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
        self.tail = near_zero(nn.Conv2d(width, 4 * out_channels, 3, padding=1))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.head(F.pixel_unshuffle(x, 2)))
        for block in self.body:
            h = h + block(h)
        return x[:, : self.out_channels] + F.pixel_shuffle(self.tail(h), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return padded(x, self.multiple, self._forward)
