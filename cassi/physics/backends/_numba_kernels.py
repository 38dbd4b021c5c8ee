"""The numba kernels of ``backend="numba"`` (imported on first use by ``cassi.physics.backends.numba``).

Two layouts, both with the inner loop over contiguous memory:

* ``*_w``: dispersion along the last (contiguous) axis. x (B, C, H, W), y (B, 1, H, W+Δ); one task per
  (sample, block of R rows) sums every band into its y rows (A), or per (sample, group of bands, block of
  rows) spreads the y rows into those bands (Aᵀ). Bands are visited a few (``_CB``) at a time, so that a
  task streams a few x rows at once, not all C (closer to the copy floor than per-row tasks; measured:
  docs/benchmarks.md, "Blocked tasks"):

      A:   y[b,0,h,j]  = Σ_c a_c·z_c[h, j−k_c] + f_c·z_c[h, j−k_c−1],   z = M ⊙ x
      Aᵀ:  x[b,c,h,w]  = M_c[h,w]·(a_c·r[h, w+k_c] + f_c·r[h, w+k_c+1]),   r = y (or w ⊙ y)

* ``*_h``: dispersion along the rows (axis "h" of the operator, arrays in their stored layout).
  X (B, C, Hx, Wd), Y (B, 1, Hx+Δ, Wd); one task per (sample, y row) for A, per (sample, x row) for Aᵀ:

      A:   Y[b,0,i,:]  = Σ_c a_c·(M ⊙ X)_c[i−k_c, :] + f_c·(M ⊙ X)_c[i−k_c−1, :]
      Aᵀ:  X[b,c,h,:]  = M_c[h,:]·(a_c·R[h+k_c, :] + f_c·R[h+k_c+1, :])

with d_c = k_c + f_c, a_c = 1 − f_c. Masks broadcast over batch (Bm = 1) and bands (Cm = 1); the
weights ``wt`` (Bw, H', W') of the data step over batch (Bw = 1). Sums run in the arrays'
dtype (float32 or float64), like the torch backends. Each kernel is a task (``_*_task``) run
by a ``prange`` loop (``parallel=True``; the caller sets the threads with ``numba.set_num_threads``)
or by a plain loop (its ``*_serial`` twin, for forked children, where numba's OpenMP layer aborts);
``cache=True``: compiled code is kept on disk (the ``__pycache__`` beside this file, or
``NUMBA_CACHE_DIR``), so a second process does not recompile.

Along w, Aᵀ (and ``pinv``) can write x with non-temporal stores (``nt``: each row computed into a scratch row,
then ``_stream``-ed; the caller asks for it when x exceeds the last-level cache): they skip the read for
ownership of x's lines (measured: docs/benchmarks.md, "Non-temporal stores"), and so can the data step (since
its kernels take flat arrays; measured: docs/benchmarks.md, "Block sizes").
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

_JIT = dict(parallel=True, cache=True, nogil=True, fastmath=False, boundscheck=False)
_SERIAL = dict(cache=True, nogil=True, fastmath=False, boundscheck=False)  # forked children, 1 thread
_HELPER = dict(cache=True, nogil=True, fastmath=False, boundscheck=False, inline="always")


_CB = 4  # bands per pass: a task streams this many x rows at a time (``_accumulate`` sums four in one pass)


@intrinsic
def _nt_store(typingctx, dst, i, src, j):
    """dst[i:i+V] = src[j:j+V], V = 64 bytes / itemsize, as one non-temporal vector store (it bypasses the
    caches: no read-for-ownership of dst's line); dst + i must be 64-byte aligned. Only for contiguous 1-D
    arrays of one float dtype (anything else does not type: the store ignores strides)."""
    arrays = isinstance(dst, types.Array) and isinstance(src, types.Array)
    if not (arrays and dst.ndim == src.ndim == 1 and dst.layout == src.layout == "C" and dst.dtype == src.dtype
            and dst.dtype in (types.float32, types.float64)):
        return None

    def codegen(context, builder, signature, args):
        d, ii, s, jj = args
        dst_a = context.make_array(signature.args[0])(context, builder, d)
        src_a = context.make_array(signature.args[2])(context, builder, s)
        scalar = context.get_data_type(signature.args[0].dtype)
        vec = ir.VectorType(scalar, 64 // context.get_abi_sizeof(scalar)).as_pointer()
        v = builder.load(builder.bitcast(builder.gep(src_a.data, [jj]), vec), align=context.get_abi_sizeof(scalar))
        st = builder.store(v, builder.bitcast(builder.gep(dst_a.data, [ii]), vec), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
    return types.void(dst, i, src, j), codegen


@intrinsic
def _fence(typingctx):
    """A full memory fence: orders a task's non-temporal stores before the kernel returns."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
    return types.void(), codegen


@njit(**_HELPER)
def _stream(dst, src):
    """dst[:] = src[:] (1-D, same dtype): plain stores up to dst's first 64-byte boundary and after its last,
    non-temporal 64-byte stores in between."""
    n, size, addr = dst.shape[0], dst.itemsize, dst.ctypes.data
    v = 64 // size
    # plain stores up to the 64-byte boundary; all of them if dst is off its own element alignment (none reached)
    w = n if addr % size else min(n, ((-addr) & 63) // size)
    for j in range(w):
        dst[j] = src[j]
    while w + v <= n:
        _nt_store(dst, w, src, w)
        w += v
    for j in range(w, n):
        dst[j] = src[j]


@njit(**_HELPER)
def _accumulate(af, ao, aw, xf, xo, mf, mo, R, C, H, W, Cm, k, a, f):
    """acc (R, W+Δ) += Σ_c taps of (M ⊙ x)_c[h0 + r, :] for every row r < R, on flat C-ordered arrays: acc's
    row r starts at af[ao + r·aw], x's band c row h0 + r at xf[xo + c·H·W + r·W], the mask's at
    mf[mo + (c if Cm > 1 else 0)·H·W + r·W] (xo, mo: offsets of row h0 of band 0 in the sample).
    Bands in groups of ``_CB``, the R rows inside a group, so that few x rows stream at once while acc stays
    in cache. A group of four integer taps is summed in one pass over the columns where all four land
    (``acc`` loaded and stored once per four bands, not once per band; measured: docs/benchmarks.md, "Blocked
    tasks"), its edges band by band. Offsets are unsigned (uint64) and the arrays flat: numba checks a signed
    index for wrap-around (a branch per element that also keeps LLVM from vectorising; measured:
    docs/benchmarks.md, "Index slices with the loop counter alone"), and a row's slice objects cost as much as its
    short edge loops (measured: docs/benchmarks.md, "Flat unsigned offsets")."""
    U = np.uint64
    plane, Wu, awu = U(H) * U(W), U(W), U(aw)
    for c0 in range(0, C, _CB):
        # the fused path takes exactly four bands: it needs _CB == 4 (the group A's tasks step by)
        four = _CB == 4 and c0 + 4 <= C and f[c0] == 0 and f[c0 + 1] == 0 and f[c0 + 2] == 0 and f[c0 + 3] == 0
        if four:
            k0, k1, k2, k3 = k[c0], k[c0 + 1], k[c0 + 2], k[c0 + 3]
            lo, hi = max(max(k0, k1), max(k2, k3)), min(min(k0, k1), min(k2, k3)) + W
            four = lo < hi
        if four:
            n = hi - lo
            x0, x1 = U(c0) * plane + U(lo - k0), U(c0 + 1) * plane + U(lo - k1)
            x2, x3 = U(c0 + 2) * plane + U(lo - k2), U(c0 + 3) * plane + U(lo - k3)
            if Cm > 1:  # a mask plane per band
                m0, m1, m2, m3 = x0, x1, x2, x3
            else:
                m0, m1, m2, m3 = U(lo - k0), U(lo - k1), U(lo - k2), U(lo - k3)
            for r in range(R):
                ar, xr, mr = ao + U(r) * awu, xo + U(r) * Wu, mo + U(r) * Wu
                d = ar + U(lo)
                p0, p1, p2, p3 = xr + x0, xr + x1, xr + x2, xr + x3
                q0, q1, q2, q3 = mr + m0, mr + m1, mr + m2, mr + m3
                for t in range(n):
                    i = U(t)
                    af[d + i] += ((mf[q0 + i] * xf[p0 + i] + mf[q1 + i] * xf[p1 + i])
                                  + (mf[q2 + i] * xf[p2 + i] + mf[q3 + i] * xf[p3 + i]))
                # the edges, where fewer than four bands land (short); plain loops: the same loops in an
                # inline="always" helper summed wrongly on 9-column rows (numba 0.68; tests/test_operator.py's
                # step-1 and step-2 cases failed with it)
                for c in range(c0, c0 + 4):
                    kc = k[c]
                    xc = xr + U(c) * plane
                    mc = mr + (U(c) * plane if Cm > 1 else U(0))
                    dc = ar + U(kc)
                    for t in range(lo - kc):  # columns kc … lo − 1 of acc: x columns 0 … lo − kc − 1
                        i = U(t)
                        af[dc + i] += mf[mc + i] * xf[xc + i]
                    for t in range(hi - kc, W):  # columns hi … kc + W − 1 of acc
                        i = U(t)
                        af[dc + i] += mf[mc + i] * xf[xc + i]
            continue
        for r in range(R):  # rows outer, the group's bands inner: acc's row stays in L1 across them
            for c in range(c0, min(C, c0 + _CB)):
                kc, fc = k[c], f[c]
                d = ao + U(r) * awu + U(kc)
                p = xo + U(c) * plane + U(r) * Wu
                q = mo + (U(c) * plane if Cm > 1 else U(0)) + U(r) * Wu
                if fc == 0:
                    for t in range(W):
                        i = U(t)
                        af[d + i] += mf[q + i] * xf[p + i]
                else:  # two taps; written as a gather so that the loop carries no store-to-load dependency
                    ac = a[c]
                    af[d] += ac * (mf[q] * xf[p])
                    for t in range(1, W):
                        i = U(t)
                        af[d + i] += ac * (mf[q + i] * xf[p + i]) + fc * (mf[q + i - U(1)] * xf[p + i - U(1)])
                    af[d + Wu] += fc * (mf[q + Wu - U(1)] * xf[p + Wu - U(1)])


@njit(**_HELPER)
def _spread_row(df, d, zf, z, mf, q, rf, s, n, ac, fc, add):
    """df[d + w] = (zf[z + w] +) mf[q + w]·(a_c·rf[s + w] + f_c·rf[s + w + 1]) (f_c = 0: the first tap alone)
    for w < n: one x row, flat arrays, unsigned offsets (see ``_accumulate``)."""
    U = np.uint64
    if add:
        if fc == 0:
            for t in range(n):
                i = U(t)
                df[d + i] = zf[z + i] + mf[q + i] * rf[s + i]
        else:
            for t in range(n):
                i = U(t)
                df[d + i] = zf[z + i] + mf[q + i] * (ac * rf[s + i] + fc * rf[s + i + U(1)])
    elif fc == 0:
        for t in range(n):
            i = U(t)
            df[d + i] = mf[q + i] * rf[s + i]
    else:
        for t in range(n):
            i = U(t)
            df[d + i] = mf[q + i] * (ac * rf[s + i] + fc * rf[s + i + U(1)])


@njit(**_HELPER)
def _spread(rf, ro, rw, xf, xo, mf, mo, zf, R, c0, c1, H, W, Cm, k, a, f, add, tmp, nt):
    """x[c, h0 + r, :] = (z[c, h0 + r, :] +) M_c[h0 + r, :] ⊙ window_c(rr[r]) for bands c0 ≤ c < c1 and every
    row r < R, on flat C-ordered arrays: rr's row r at rf[ro + r·rw] (R × (W+Δ)), x's (and z's, same layout)
    band c row h0 + r at xf[xo + c·H·W + r·W], the mask's at mf[mo + (c if Cm > 1 else 0)·H·W + r·W]. Rows
    outer, the band group inner (a few x rows written at once). With ``nt`` each x row is computed into
    ``tmp`` (W,), then streamed to x with non-temporal stores (from a call site of its own: one loop that
    wrote either ``tmp`` or the x row, chosen at run time, was not vectorised)."""
    U = np.uint64
    plane, Wu, rwu = U(H) * U(W), U(W), U(rw)
    for r in range(R):
        rr, xr, mr = ro + U(r) * rwu, xo + U(r) * Wu, mo + U(r) * Wu
        for c in range(c0, c1):
            p = xr + U(c) * plane
            q = mr + (U(c) * plane if Cm > 1 else U(0))
            s = rr + U(k[c])  # rr[r, k_c + 1 + w] (the second tap) is read only when f_c ≠ 0: then k_c + W < W + Δ
            if nt:
                _spread_row(tmp, U(0), zf, p, mf, q, rf, s, W, a[c], f[c], add)
                _stream(xf[p:p + Wu], tmp)
            else:
                _spread_row(xf, p, zf, p, mf, q, rf, s, W, a[c], f[c], add)


@njit(**_HELPER)
def _at(t, i, j, h):
    """The flat (uint64) offset of t[i, j, h, 0] in a C-contiguous 4-D array t."""
    U = np.uint64
    return ((U(i) * U(t.shape[1]) + U(j)) * U(t.shape[2]) + U(h)) * U(t.shape[3])


# ----------------------------------------------------------------------------- dispersion along w
# Tasks cover blocks of R rows (R chosen by the caller: large, yet enough tasks for the threads).


@njit(**_HELPER)
def _fwd_w_task(i, x, m, k, a, f, y, R):
    H = x.shape[2]
    nb = (H + R - 1) // R
    b, h0 = i // nb, (i % nb) * R
    h1 = min(H, h0 + R)
    y[b, 0, h0:h1] = 0
    _accumulate(y.reshape(-1), _at(y, b, 0, h0), y.shape[3], x.reshape(-1), _at(x, b, 0, h0), m.reshape(-1),
                _at(m, b if m.shape[0] > 1 else 0, 0, h0), h1 - h0, x.shape[1], H, x.shape[3], m.shape[1], k, a, f)


@njit(**_HELPER)
def _adj_w_task(i, y, m, k, a, f, x, z, add, R, nt):
    C, H = x.shape[1], x.shape[2]
    nb, ng = (H + R - 1) // R, (C + _CB - 1) // _CB
    b, j = i // (ng * nb), i % (ng * nb)
    c0, h0 = (j // nb) * _CB, (j % nb) * R
    h1 = min(H, h0 + R)
    tmp = np.empty(x.shape[3] if nt else 0, dtype=x.dtype)  # the streamed row's scratch
    _spread(y.reshape(-1), _at(y, b, 0, h0), y.shape[3], x.reshape(-1), _at(x, b, 0, h0), m.reshape(-1),
            _at(m, b if m.shape[0] > 1 else 0, 0, h0), z.reshape(-1), h1 - h0, c0, min(C, c0 + _CB), H, x.shape[3],
            m.shape[1], k, a, f, add, tmp, nt)
    if nt:
        _fence()


@njit(**_JIT)
def fwd_w(x, m, k, a, f, y, R):
    """y = A x: x (B, C, H, W) -> y (B, 1, H, W+Δ), one task per (sample, block of R rows)."""
    for i in prange(x.shape[0] * ((x.shape[2] + R - 1) // R)):
        _fwd_w_task(i, x, m, k, a, f, y, R)


@njit(**_SERIAL)
def fwd_w_serial(x, m, k, a, f, y, R):
    for i in range(x.shape[0] * ((x.shape[2] + R - 1) // R)):
        _fwd_w_task(i, x, m, k, a, f, y, R)


@njit(**_JIT)
def adj_w(y, m, k, a, f, x, z, add, R, nt):
    """x = (z +) Aᵀ y: y (B, 1, H, W+Δ) -> x (B, C, H, W), one task per (sample, group of ``_CB`` bands, block
    of R rows); ``nt``: x written with non-temporal stores."""
    for i in prange(x.shape[0] * ((x.shape[1] + _CB - 1) // _CB) * ((x.shape[2] + R - 1) // R)):
        _adj_w_task(i, y, m, k, a, f, x, z, add, R, nt)


@njit(**_SERIAL)
def adj_w_serial(y, m, k, a, f, x, z, add, R, nt):
    for i in range(x.shape[0] * ((x.shape[1] + _CB - 1) // _CB) * ((x.shape[2] + R - 1) // R)):
        _adj_w_task(i, y, m, k, a, f, x, z, add, R, nt)


@njit(**_HELPER)
def _step_w_task(i, z, y, wt, m, k, a, f, x, u, R, nt):
    C, H = z.shape[1], z.shape[2]
    nb = (H + R - 1) // R
    b, h0 = i // nb, (i % nb) * R
    h1 = min(H, h0 + R)
    W, Wy = z.shape[3], y.shape[3]
    af, zf, mf = np.zeros((h1 - h0) * Wy, dtype=y.dtype), z.reshape(-1), m.reshape(-1)
    zo, mo = _at(z, b, 0, h0), _at(m, b if m.shape[0] > 1 else 0, 0, h0)
    _accumulate(af, np.uint64(0), Wy, zf, zo, mf, mo, h1 - h0, C, H, W, m.shape[1], k, a, f)
    acc = af.reshape((h1 - h0, Wy))
    yr, ur, wr = y[b, 0, h0:h1], u[b, 0, h0:h1], wt[b if wt.shape[0] > 1 else 0, h0:h1]
    for r in range(h1 - h0):
        for j in range(acc.shape[1]):
            ur[r, j] = yr[r, j] - acc[r, j]
            acc[r, j] = wr[r, j] * ur[r, j]
    xf, xo = x.reshape(-1), _at(x, b, 0, h0)
    tmp = np.empty(W if nt else 0, dtype=x.dtype)  # the streamed row's scratch
    for c0 in range(0, C, _CB):
        _spread(af, np.uint64(0), Wy, xf, xo, mf, mo, zf, h1 - h0, c0, min(C, c0 + _CB), H, W, m.shape[1], k, a, f,
                True, tmp, nt)
    if nt:
        _fence()


@njit(**_JIT)
def step_w(z, y, wt, m, k, a, f, x, u, R, nt):
    """u = y − A z and x = z + Aᵀ(wt ⊙ u) in one pass per (sample, block of R rows): the block of z is read
    again from cache (R small enough for it to stay there); ``nt``: x written with non-temporal stores."""
    for i in prange(z.shape[0] * ((z.shape[2] + R - 1) // R)):
        _step_w_task(i, z, y, wt, m, k, a, f, x, u, R, nt)


@njit(**_SERIAL)
def step_w_serial(z, y, wt, m, k, a, f, x, u, R, nt):
    for i in range(z.shape[0] * ((z.shape[2] + R - 1) // R)):
        _step_w_task(i, z, y, wt, m, k, a, f, x, u, R, nt)


# ----------------------------------------------------------------------------- dispersion along h
@njit(**_HELPER)
def _accumulate_rows(acc, x3, m3, i, k, a, f):
    """acc (Wd,) += Σ_c taps of (M ⊙ X)_c landing on y row i; x3 (C, Hx, Wd), m3 (Cm, Hx, Wd)."""
    C, Hx, Wd = x3.shape
    Cm = m3.shape[0]
    for c in range(C):
        mc = c if Cm > 1 else 0
        kc, fc = k[c], f[c]
        h = i - kc  # tap 0 (weight a_c) comes from x row h, tap 1 (weight f_c) from row h − 1
        if 0 <= h < Hx:
            xr, mr = x3[c, h], m3[mc, h]
            if fc == 0:
                for w in range(Wd):
                    acc[w] += mr[w] * xr[w]
            else:
                ac = a[c]
                for w in range(Wd):
                    acc[w] += ac * (mr[w] * xr[w])
        if fc != 0 and 0 <= h - 1 < Hx:
            xr, mr = x3[c, h - 1], m3[mc, h - 1]
            for w in range(Wd):
                acc[w] += fc * (mr[w] * xr[w])


@njit(**_HELPER)
def _fwd_h_task(i, x, m, k, a, f, y):
    Hy = y.shape[2]
    b, r = i // Hy, i % Hy
    yr = y[b, 0, r]
    yr[:] = 0
    _accumulate_rows(yr, x[b], m[b if m.shape[0] > 1 else 0], r, k, a, f)


@njit(**_JIT)
def fwd_h(x, m, k, a, f, y):
    """Y = A X along rows: X (B, C, Hx, Wd) -> Y (B, 1, Hx+Δ, Wd), one task per (b, y row)."""
    for i in prange(y.shape[0] * y.shape[2]):
        _fwd_h_task(i, x, m, k, a, f, y)


@njit(**_SERIAL)
def fwd_h_serial(x, m, k, a, f, y):
    for i in range(y.shape[0] * y.shape[2]):
        _fwd_h_task(i, x, m, k, a, f, y)


@njit(**_HELPER)
def _adj_h_task(i, y, m, k, a, f, x, z, add):
    B, C, Hx, Wd = x.shape
    Bm = m.shape[0]
    Cm = m.shape[1]
    b, h = i // Hx, i % Hx
    mb = b if Bm > 1 else 0
    for c in range(C):
        xr, mr = x[b, c, h], m[mb, c if Cm > 1 else 0, h]
        kc, fc, ac = k[c], f[c], a[c]
        r0 = y[b, 0, h + kc]
        if fc == 0:
            if add:
                zr = z[b, c, h]
                for w in range(Wd):
                    xr[w] = zr[w] + mr[w] * r0[w]
            else:
                for w in range(Wd):
                    xr[w] = mr[w] * r0[w]
        else:
            r1 = y[b, 0, h + kc + 1]
            if add:
                zr = z[b, c, h]
                for w in range(Wd):
                    xr[w] = zr[w] + mr[w] * (ac * r0[w] + fc * r1[w])
            else:
                for w in range(Wd):
                    xr[w] = mr[w] * (ac * r0[w] + fc * r1[w])


@njit(**_JIT)
def adj_h(y, m, k, a, f, x, z, add):
    """X = (z +) Aᵀ Y along rows: Y (B, 1, Hx+Δ, Wd) -> X (B, C, Hx, Wd), one task per (b, x row)."""
    for i in prange(x.shape[0] * x.shape[2]):
        _adj_h_task(i, y, m, k, a, f, x, z, add)


@njit(**_SERIAL)
def adj_h_serial(y, m, k, a, f, x, z, add):
    for i in range(x.shape[0] * x.shape[2]):
        _adj_h_task(i, y, m, k, a, f, x, z, add)


@njit(**_HELPER)
def _residual_h_task(i, z, y, wt, m, k, a, f, u, r):
    Hy, Wd = y.shape[2], y.shape[3]
    Bm, Bw = m.shape[0], wt.shape[0]
    b, j = i // Hy, i % Hy
    acc = np.zeros(Wd, dtype=y.dtype)
    _accumulate_rows(acc, z[b], m[b if Bm > 1 else 0], j, k, a, f)
    yr, ur, rr, wr = y[b, 0, j], u[b, 0, j], r[b, 0, j], wt[b if Bw > 1 else 0, j]
    for w in range(Wd):
        ur[w] = yr[w] - acc[w]
        rr[w] = wr[w] * ur[w]


@njit(**_JIT)
def residual_h(z, y, wt, m, k, a, f, u, r):
    """u = Y − A Z and r = wt ⊙ u along rows, one task per (b, y row): the data step's first half."""
    for i in prange(y.shape[0] * y.shape[2]):
        _residual_h_task(i, z, y, wt, m, k, a, f, u, r)


@njit(**_SERIAL)
def residual_h_serial(z, y, wt, m, k, a, f, u, r):
    for i in range(y.shape[0] * y.shape[2]):
        _residual_h_task(i, z, y, wt, m, k, a, f, u, r)


@njit(**_HELPER)
def _tv_planes_task(n, f, out, c, iters):
    N, H, W = f.shape
    one, inv_w, tau, w = c[0], c[1], c[2], c[3]  # in f's dtype: Python floats would promote float32 to float64
    fn = f[n]
    p1 = np.zeros((H, W), f.dtype)   # p along h
    p2 = np.zeros((H, W), f.dtype)   # p along w
    z = np.empty((H, W), f.dtype)
    for it in range(iters):
        # z = div p − f/w; div p[i] = p[i] − p[i−1] (p[−1] = 0, p[N−1] stays 0)
        for i in range(H):
            zr, fr, a1, a2 = z[i], fn[i], p1[i], p2[i]
            if i > 0:
                b1 = p1[i - 1]
                zr[0] = a1[0] - b1[0] + a2[0] - fr[0] * inv_w
                for j in range(1, W):
                    zr[j] = a1[j] - b1[j] + a2[j] - a2[j - 1] - fr[j] * inv_w
            else:
                zr[0] = a1[0] + a2[0] - fr[0] * inv_w
                for j in range(1, W):
                    zr[j] = a1[j] + a2[j] - a2[j - 1] - fr[j] * inv_w
        # p ← (p + τ∇z) / (1 + τ|∇z|), ∇z = 0 at the far edges
        for i in range(H):
            zr, a1, a2 = z[i], p1[i], p2[i]
            if i < H - 1:
                zn = z[i + 1]
                for j in range(W - 1):
                    g1 = zn[j] - zr[j]
                    g2 = zr[j + 1] - zr[j]
                    inv = one / (one + tau * np.sqrt(g1 * g1 + g2 * g2))
                    a1[j] = (a1[j] + tau * g1) * inv
                    a2[j] = (a2[j] + tau * g2) * inv
                g1 = zn[W - 1] - zr[W - 1]
                den = one + tau * abs(g1)
                a1[W - 1] = (a1[W - 1] + tau * g1) / den
                a2[W - 1] = a2[W - 1] / den
            else:
                for j in range(W - 1):
                    g2 = zr[j + 1] - zr[j]
                    den = one + tau * abs(g2)
                    a1[j] = a1[j] / den
                    a2[j] = (a2[j] + tau * g2) / den
    # out = f − w·div p
    o = out[n]
    for i in range(H):
        a1, a2, fr, orow = p1[i], p2[i], fn[i], o[i]
        if i > 0:
            b1 = p1[i - 1]
            orow[0] = fr[0] - w * (a1[0] - b1[0] + a2[0])
            for j in range(1, W):
                orow[j] = fr[j] - w * (a1[j] - b1[j] + a2[j] - a2[j - 1])
        else:
            orow[0] = fr[0] - w * (a1[0] + a2[0])
            for j in range(1, W):
                orow[j] = fr[j] - w * (a1[j] + a2[j] - a2[j - 1])


@njit(**_JIT)
def tv_planes(f, out, c, iters):
    """Chambolle's TV denoiser D_w(f) = argmin_u ½‖u − f‖² + w·TV(u) (2-D isotropic TV) on every plane of
    f (N, H, W), ``iters`` dual steps from p = 0; one task per plane, whose p, z stay in cache:

        z = div p − f/w;   p ← (p + τ∇z) / (1 + τ|∇z|);   out = f − w·div p

    (∇: forward differences, 0 at the far edges; div = −∇ᵀ). ``out`` may be ``f`` (read and written at the
    same index only). ``c`` = [1, 1/w, τ, w] in f's dtype: float32 data then computes in float32, where
    Python-float constants would promote the loops to float64 (measured: docs/benchmarks.md, "GAP-TV against a
    textbook implementation")."""
    for n in prange(f.shape[0]):
        _tv_planes_task(n, f, out, c, iters)


@njit(**_SERIAL)
def tv_planes_serial(f, out, c, iters):
    for n in range(f.shape[0]):
        _tv_planes_task(n, f, out, c, iters)
