"""Triton kernels of the ``triton`` backend (see cassi/physics/backends/triton.py for the design).

Imported only when a kernel first runs: ``import cassi`` must not import triton. Each kernel takes
explicit strides; ``I64`` switches index arithmetic to 64 bits, ``ACC`` is the accumulation dtype.
"""
import triton
import triton.language as tl


@triton.jit
def gather(xrow, mrow, k_ptr, f_ptr, C, W, j, hok, sxc, sxw, smc, smw,
           FRAC: tl.constexpr, I64: tl.constexpr, ACC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """(A x) on a tile: rows at xrow/mrow (BLOCK_H, 1), columns j (BLOCK_W,) of y."""
    acc = tl.zeros([BLOCK_H, BLOCK_W], dtype=ACC)
    for cb in range(C):
        c = cb
        if I64:
            c = tl.cast(cb, tl.int64)
        w0 = (j - tl.load(k_ptr + c))[None, :]
        ok = hok & (w0 >= 0) & (w0 < W)
        xv = tl.load(xrow + c * sxc + w0 * sxw, mask=ok, other=0.0).to(ACC)
        mv = tl.load(mrow + c * smc + w0 * smw, mask=ok, other=0.0).to(ACC)
        if FRAC:  # second tap: the same cache lines
            f = tl.load(f_ptr + c)
            ok1 = hok & (w0 >= 1) & (w0 <= W)
            x1 = tl.load(xrow + c * sxc + (w0 - 1) * sxw, mask=ok1, other=0.0).to(ACC)
            m1 = tl.load(mrow + c * smc + (w0 - 1) * smw, mask=ok1, other=0.0).to(ACC)
            acc += (1 - f) * (xv * mv) + f * (x1 * m1)
        else:
            acc += xv * mv
    return acc


@triton.jit
def window(yrow, srow, f_ptr, c, j, ok, WY, syw, ssw,
           SCALE: tl.constexpr, FRAC: tl.constexpr, ACC: tl.constexpr):
    """(1−f_c)·v[j] + f_c·v[j+1] on a tile, v = y (or s ⊙ y with SCALE); j = w + k_c (1, BLOCK_W)."""
    v = tl.load(yrow + j * syw, mask=ok, other=0.0).to(ACC)
    if SCALE:
        v *= tl.load(srow + j * ssw, mask=ok, other=0.0).to(ACC)
    if FRAC:
        f = tl.load(f_ptr + c)
        ok1 = ok & (j + 1 < WY)
        v1 = tl.load(yrow + (j + 1) * syw, mask=ok1, other=0.0).to(ACC)
        if SCALE:
            v1 *= tl.load(srow + (j + 1) * ssw, mask=ok1, other=0.0).to(ACC)
        v = (1 - f) * v + f * v1
    return v


@triton.jit
def fwd(x_ptr, m_ptr, y_ptr, k_ptr, f_ptr, C, H, W, WY,
        sxb, sxc, sxh, sxw, smb, smc, smh, smw, syb, syh, syw,
        FRAC: tl.constexpr, I64: tl.constexpr, ACC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """y[b, 0, h, j] = Σ_c (1−f_c)·(M x)[b, c, h, j−k_c] + f_c·(M x)[b, c, h, j−k_c−1]."""
    nh = tl.cdiv(H, BLOCK_H)
    b = tl.program_id(0) // nh
    h = (tl.program_id(0) % nh) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    if I64:
        b, h, j = b.to(tl.int64), h.to(tl.int64), j.to(tl.int64)
    hok = (h < H)[:, None]
    acc = gather(x_ptr + b * sxb + h[:, None] * sxh, m_ptr + b * smb + h[:, None] * smh, k_ptr, f_ptr, C, W, j,
                 hok, sxc, sxw, smc, smw, FRAC, I64, ACC, BLOCK_H, BLOCK_W)
    tl.store(y_ptr + b * syb + h[:, None] * syh + j[None, :] * syw, acc.to(y_ptr.dtype.element_ty),
             mask=hok & (j < WY)[None, :])


@triton.jit
def adj(y_ptr, s_ptr, m_ptr, x_ptr, k_ptr, f_ptr, C, H, W, WY,
        syb, syh, syw, ssb, ssh, ssw, smb, smc, smh, smw, sxb, sxc, sxh, sxw,
        SCALE: tl.constexpr, FRAC: tl.constexpr, I64: tl.constexpr, ACC: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """x[b, c, h, w] = M·((1−f_c)·v[w+k_c] + f_c·v[w+k_c+1]), v = y (or s ⊙ y with SCALE)."""
    nh = tl.cdiv(H, BLOCK_H)
    row = tl.program_id(0)
    h = (row % nh) * BLOCK_H + tl.arange(0, BLOCK_H)
    c = (row // nh) % C
    b = row // (nh * C)
    w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    if I64:
        b, c, h, w = b.to(tl.int64), c.to(tl.int64), h.to(tl.int64), w.to(tl.int64)
    ok = (h < H)[:, None] & (w < W)[None, :]
    v = window(y_ptr + b * syb + h[:, None] * syh, s_ptr + b * ssb + h[:, None] * ssh, f_ptr, c,
               (w + tl.load(k_ptr + c))[None, :], ok, WY, syw, ssw, SCALE, FRAC, ACC)
    m = tl.load(m_ptr + b * smb + c * smc + h[:, None] * smh + w[None, :] * smw, mask=ok, other=0.0)
    tl.store(x_ptr + b * sxb + c * sxc + h[:, None] * sxh + w[None, :] * sxw,
             (m.to(ACC) * v).to(x_ptr.dtype.element_ty), mask=ok)


@triton.jit
def step(z_ptr, y_ptr, s_ptr, m_ptr, x_ptr, u_ptr, k_ptr, f_ptr, C, H, W, WY,
         szb, szc, szh, szw, syb, syh, syw, ssb, ssh, ssw, smb, smc, smh, smw,
         sxb, sxc, sxh, sxw, sub, suh, suw,
         FRAC: tl.constexpr, I64: tl.constexpr, ACC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """u = y − A z (in ACC) and x = z + Aᵀ(s ⊙ u) for a block of BLOCK_H rows of one sample."""
    nh = tl.cdiv(H, BLOCK_H)
    b = tl.program_id(0) // nh
    h = (tl.program_id(0) % nh) * BLOCK_H + tl.arange(0, BLOCK_H)
    if I64:
        b, h = b.to(tl.int64), h.to(tl.int64)
    hok = (h < H)[:, None]
    zrow = z_ptr + b * szb + h[:, None] * szh
    mrow = m_ptr + b * smb + h[:, None] * smh
    urow = u_ptr + b * sub + h[:, None] * suh
    srow = s_ptr + b * ssb + h[:, None] * ssh
    # 1. u = y − A z over the rows' full width
    for j0 in range(0, WY, BLOCK_W):
        j = j0 + tl.arange(0, BLOCK_W)
        if I64:
            j = j.to(tl.int64)
        acc = gather(zrow, mrow, k_ptr, f_ptr, C, W, j, hok, szc, szw, smc, smw, FRAC, I64, ACC, BLOCK_H, BLOCK_W)
        jok = hok & (j < WY)[None, :]
        yv = tl.load(y_ptr + b * syb + h[:, None] * syh + j[None, :] * syw, mask=jok, other=0.0).to(ACC)
        tl.store(urow + j[None, :] * suw, yv - acc, mask=jok)
    tl.debug_barrier()  # this program's u rows are complete: read them back shifted
    # 2. x = z + M ⊙ window(s ⊙ u), band by band
    for cb in range(C):
        c = cb
        if I64:
            c = tl.cast(cb, tl.int64)
        k = tl.load(k_ptr + c)
        for w0 in range(0, W, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            if I64:
                w = w.to(tl.int64)
            ok = hok & (w < W)[None, :]
            v = window(urow, srow, f_ptr, c, (w + k)[None, :], ok, WY, suw, ssw, True, FRAC, ACC)
            m = tl.load(mrow + c * smc + w[None, :] * smw, mask=ok, other=0.0).to(ACC)
            zv = tl.load(zrow + c * szc + w[None, :] * szw, mask=ok, other=0.0).to(ACC)
            tl.store(x_ptr + b * sxb + c * sxc + h[:, None] * sxh + w[None, :] * sxw,
                     (zv + m * v).to(x_ptr.dtype.element_ty), mask=ok)
