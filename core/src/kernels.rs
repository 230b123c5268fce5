//! Reference kernels. Tensors are little-endian bytes of a [`DType`]; arithmetic is `f32`
//! (`f16` widens, computes, and rounds back to nearest-even). Every reduction sums in a fixed
//! order (ascending index), so results are bit-identical on every target. The one exception is
//! opt-in: the fast `f32` matmul of [`wide`] (x86-64 with AVX2 or AVX-512 and FMA) joins each
//! term to its sum with a fused multiply-add, in the same order, so its results are the same
//! on every CPU that runs it and differ from the portable kernels' in the last bits.

use crate::f16::{f16_to_f32, f32_to_f16};
use crate::DType;

/// Reads element `i` of a tensor of type `dt` as `f32`.
#[inline(always)]
pub fn load(buf: &[u8], dt: DType, i: usize) -> f32 {
    match dt {
        DType::F32 => {
            f32::from_le_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]])
        }
        DType::F16 => f16_to_f32(u16::from_le_bytes([buf[2 * i], buf[2 * i + 1]])),
        DType::I32 => {
            i32::from_le_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]]) as f32
        }
        DType::U8 => f32::from(buf[i]),
    }
}

/// Reads element `i` of an integer (or float, truncated) tensor as `i64`.
#[inline]
pub fn load_int(buf: &[u8], dt: DType, i: usize) -> i64 {
    match dt {
        DType::I32 => i64::from(i32::from_le_bytes([
            buf[4 * i],
            buf[4 * i + 1],
            buf[4 * i + 2],
            buf[4 * i + 3],
        ])),
        DType::U8 => i64::from(buf[i]),
        _ => load(buf, dt, i) as i64,
    }
}

/// Writes `v` as element `i` of a tensor of type `dt` (rounding to nearest-even for `f16`;
/// float to integer truncates toward zero and saturates, NaN becomes 0).
#[inline(always)]
pub fn store(buf: &mut [u8], dt: DType, i: usize, v: f32) {
    match dt {
        DType::F32 => buf[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => buf[2 * i..2 * i + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes()),
        DType::I32 => buf[4 * i..4 * i + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::U8 => buf[i] = v as u8,
    }
}

/// `out[i] = f(x[i])`.
pub fn map(x: &[u8], xt: DType, out: &mut [u8], ot: DType, n: usize, f: impl Fn(f32) -> f32) {
    if xt == DType::F32 && ot == DType::F32 {
        // The common case, written so the compiler can vectorise it.
        for (o, x) in out[..4 * n].chunks_exact_mut(4).zip(x.chunks_exact(4)) {
            o.copy_from_slice(&f(f32_of(x)).to_le_bytes());
        }
        return;
    }
    for i in 0..n {
        store(out, ot, i, f(load(x, xt, i)));
    }
}

/// `out[i] = f(a[i], b[i])`.
pub fn zip(a: &[u8], b: &[u8], t: DType, out: &mut [u8], n: usize, f: impl Fn(f32, f32) -> f32) {
    if t == DType::F32 {
        // The common case, written so the compiler can vectorise it.
        for ((o, a), b) in out[..4 * n]
            .chunks_exact_mut(4)
            .zip(a.chunks_exact(4))
            .zip(b.chunks_exact(4))
        {
            let v = f(
                f32::from_le_bytes([a[0], a[1], a[2], a[3]]),
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            );
            o.copy_from_slice(&v.to_le_bytes());
        }
        return;
    }
    for i in 0..n {
        store(out, t, i, f(load(a, t, i), load(b, t, i)));
    }
}

/// `x[i] = f(x[i], y[i])`, in place.
pub fn zip_in_place(x: &mut [u8], y: &[u8], t: DType, n: usize, f: impl Fn(f32, f32) -> f32) {
    if t == DType::F32 {
        // The common case, written so the compiler can vectorise it.
        for (xb, yb) in x[..4 * n].chunks_exact_mut(4).zip(y.chunks_exact(4)) {
            let v = f(f32_of(xb), f32_of(yb));
            xb.copy_from_slice(&v.to_le_bytes());
        }
        return;
    }
    for i in 0..n {
        let v = f(load(x, t, i), load(y, t, i));
        store(x, t, i, v);
    }
}

/// Columns of C accumulated at once in registers by [`matmul`].
const BLOCK: usize = 64;

/// The fewest `f32` elements [`zip_in_place_on`] cuts into pieces: 256 KiB, some tens of
/// microseconds of memory traffic, against a microsecond or so to share the work (an order of
/// magnitude measured on a 2-core host, not a tuned figure).
pub const ZIP_MIN_ELEMENTS: usize = 1 << 16;

/// [`zip_in_place`], `f32` tensors of at least [`ZIP_MIN_ELEMENTS`] cut into one run of
/// elements per thread of `par`. Each element is computed as alone, so the result is the
/// same bit for bit.
pub fn zip_in_place_on(
    par: &dyn Parallel,
    x: &mut [u8],
    y: &[u8],
    t: DType,
    n: usize,
    f: impl Fn(f32, f32) -> f32 + Sync,
) {
    let threads = par.threads();
    if t != DType::F32 || threads < 2 || n < ZIP_MIN_ELEMENTS {
        zip_in_place(x, y, t, n, f);
        return;
    }
    // Whole cache lines per piece.
    let per = n.div_ceil(threads).div_ceil(16) * 16;
    par.for_each_piece(&mut x[..4 * n], 4 * per, &|i, xs| {
        let at = 4 * i * per;
        zip_in_place(xs, &y[at..at + xs.len()], t, xs.len() / 4, &f);
    });
}

/// Sets the `n` elements of `x` (of type `t`) to `value`: zero (`+0.0`, all bytes zero in
/// every element type) as one memory fill, and tensors of at least [`ZIP_MIN_ELEMENTS`] cut
/// into one run of elements per thread of `par`, as [`zip_in_place_on`] cuts them. The bytes
/// written are those of storing `value` into each element.
pub fn fill_on(par: &dyn Parallel, x: &mut [u8], t: DType, n: usize, value: f32) {
    let es = t.size();
    let fill = |xs: &mut [u8]| {
        if value.to_bits() == 0 {
            xs.fill(0);
        } else if t == DType::F32 {
            for c in xs.chunks_exact_mut(4) {
                c.copy_from_slice(&value.to_le_bytes());
            }
        } else {
            for i in 0..xs.len() / es {
                store(xs, t, i, value);
            }
        }
    };
    let threads = par.threads();
    if threads < 2 || n < ZIP_MIN_ELEMENTS {
        fill(&mut x[..n * es]);
        return;
    }
    // Whole cache lines per piece, whatever the element size.
    let per = n.div_ceil(threads).div_ceil(64) * 64;
    par.for_each_piece(&mut x[..n * es], es * per, &|_, xs| fill(xs));
}

/// The shape of a matrix product `C = op(A) . op(B)` and how its operands are stored: `op(A)`
/// is (m, k) and `op(B)` is (k, n), so C is (m, n), stored row after row. `A` is stored
/// (m, k), or (k, m) when `ta`; `B` is stored (k, n), or (n, k) when `tb`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Product {
    /// Rows of `op(A)` and of C.
    pub m: usize,
    /// Columns of `op(A)` and rows of `op(B)`: the terms of each output's sum.
    pub k: usize,
    /// Columns of `op(B)` and of C.
    pub n: usize,
    /// Whether `A` is stored transposed, (k, m).
    pub ta: bool,
    /// Whether `B` is stored transposed, (n, k).
    pub tb: bool,
}

impl Product {
    /// `op(A)` (m, k) times `op(B)` (k, n), neither operand stored transposed.
    pub const fn new(m: usize, k: usize, n: usize) -> Self {
        Product {
            m,
            k,
            n,
            ta: false,
            tb: false,
        }
    }

    /// Elements between the starts of A's stored rows when A is stored whole: `k`, or `m`
    /// when `ta`.
    #[inline(always)]
    const fn lda(self) -> usize {
        if self.ta {
            self.m
        } else {
            self.k
        }
    }
}

/// `C = op(A) . op(B)`, shaped and laid out as `p` says. Each output `C[i][j]` is summed over
/// its terms `op(A)[i][q] * op(B)[q][j]` from `q = 0` upward, starting at zero.
pub fn matmul(a: &[u8], b: &[u8], t: DType, c: &mut [u8], p: Product) {
    matmul_strided(a, p.lda(), b, t, c, p);
}

/// A way to run a kernel's independent pieces, perhaps several at once: a host with threads
/// passes one that spreads them over its cores ([`Serial`] runs them one after another).
///
/// Kernels cut only work whose pieces write disjoint bytes and read nothing another piece
/// writes, each piece computed exactly as it would be alone: results are the same bit for bit
/// however the pieces are run.
pub trait Parallel: Sync {
    /// How many pieces are worth making: the threads that can run them (1: no cutting).
    fn threads(&self) -> usize;

    /// Calls `job(index, piece)` once for each piece of `out` - its consecutive runs of
    /// `piece` bytes, the last perhaps shorter - in any order and perhaps at once. `piece` is
    /// at least 1.
    fn for_each_piece(&self, out: &mut [u8], piece: usize, job: &(dyn Fn(usize, &mut [u8]) + Sync));
}

/// Runs every piece in turn on the calling thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serial;

impl Parallel for Serial {
    fn threads(&self) -> usize {
        1
    }

    fn for_each_piece(
        &self,
        out: &mut [u8],
        piece: usize,
        job: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) {
        for (i, p) in out.chunks_mut(piece.max(1)).enumerate() {
            job(i, p);
        }
    }
}

/// The fewest multiply-adds in a piece of a product cut by [`matmul_on`]: about 2 us of the
/// AVX-512 kernel, against well under a microsecond to hand a piece over (a measured order of
/// magnitude on a 2-core host, not a tuned figure). Smaller products are not cut.
pub const PIECE_MIN_MACS: usize = 1 << 17;

/// [`matmul`], its rows of C cut into blocks run as pieces by `par`: at most one per thread,
/// at most one per [`PIECE_MIN_MACS`] of the product, each a whole number of register tiles
/// but the last (which takes what is left). More, smaller pieces measured slower: each piece
/// sweeps all of B. Each output is summed as [`matmul`] sums it, so the values are the same
/// bit for bit (a NaN's payload aside: a piece may take the transposed path of
/// `matmul_f32_bt_swapped`, which multiplies the same two numbers the other way round).
pub fn matmul_on(par: &dyn Parallel, a: &[u8], b: &[u8], t: DType, c: &mut [u8], p: Product) {
    let Some(rows) = piece_rows(par, p) else {
        matmul(a, b, t, c, p);
        return;
    };
    let es = t.size();
    par.for_each_piece(&mut c[..p.m * p.n * es], rows * p.n * es, &|i, piece| {
        product_rows(a, b, t, piece, i * rows, p);
    });
}

/// The rows of C in each piece of a product cut over `par`, or `None` to leave it whole (see
/// [`matmul_on`]).
fn piece_rows(par: &dyn Parallel, p: Product) -> Option<usize> {
    let Product { m, k, n, .. } = p;
    let threads = par.threads();
    let macs = m.saturating_mul(k).saturating_mul(n);
    let pieces = (macs / PIECE_MIN_MACS).min(threads).min(m / MR);
    if threads < 2 || pieces < 2 {
        return None;
    }
    Some(m.div_ceil(pieces).div_ceil(MR) * MR)
}

/// Rows `r0..` of `op(A) . op(B)` (as many as `out` holds) into `out`, each computed as
/// [`matmul`] computes it.
fn product_rows(a: &[u8], b: &[u8], t: DType, out: &mut [u8], r0: usize, p: Product) {
    let es = t.size();
    let len = out.len() / (p.n * es);
    let block = Product { m: len, ..p };
    if p.ta {
        // Stored (k, m): the block's rows of op(A) are columns r0.. of every stored row.
        matmul_strided(&a[r0 * es..], p.m, b, t, out, block);
    } else {
        let a = &a[r0 * p.k * es..(r0 + len) * p.k * es];
        matmul_strided(a, p.k, b, t, out, block);
    }
}

/// Bytes of the stack buffer [`matmul_accumulate_on`] computes a block of a product's rows
/// in: a few register tiles of rows of a layer's weight gradient, well inside a core's level-1
/// cache, so the product's values go from the registers to the accumulator without a trip
/// through memory.
pub const ACCUMULATE_SCRATCH_BYTES: usize = 16 * 1024;

/// Whether [`matmul_accumulate_on`] takes a product with rows of `n` elements of type `t`:
/// a register tile of rows fits its stack buffer.
pub fn accumulates_rows_of(t: DType, n: usize) -> bool {
    n.saturating_mul(t.size()).saturating_mul(MR) <= ACCUMULATE_SCRATCH_BYTES
}

/// `acc[i] += (op(A) . op(B))[i]`: [`matmul_on`] followed by [`zip_in_place`] adding the
/// product into `acc`, without the product's own tensor. Rows are computed a block at a time
/// into a stack buffer of [`ACCUMULATE_SCRATCH_BYTES`] and added at once; each product value
/// is computed as [`matmul`] computes it and added as `acc + value`, so `acc` ends the same
/// bit for bit as with the product stored and added after (a NaN's payload aside, as for
/// [`matmul_on`]). Pieces are [`matmul_on`]'s.
///
/// Returns `false`, leaving `acc` untouched, when rows of `n` elements are too long for the
/// buffer ([`accumulates_rows_of`]).
pub fn matmul_accumulate_on(
    par: &dyn Parallel,
    a: &[u8],
    b: &[u8],
    t: DType,
    acc: &mut [u8],
    p: Product,
) -> bool {
    if !accumulates_rows_of(t, p.n) {
        return false;
    }
    let es = t.size();
    let (m, row) = (p.m, p.n * es);
    // Whole register tiles per block (at least one fits: checked above).
    let block = ACCUMULATE_SCRATCH_BYTES / row / MR * MR;
    let job = |r0: usize, piece: &mut [u8]| {
        let mut scratch = [0u8; ACCUMULATE_SCRATCH_BYTES];
        for (c, rows) in piece.chunks_mut(block * row).enumerate() {
            let g = &mut scratch[..rows.len()];
            product_rows(a, b, t, g, r0 + c * block, p);
            zip_in_place(rows, g, t, g.len() / es, |a, g| a + g);
        }
    };
    match piece_rows(par, p) {
        Some(rows) => par.for_each_piece(&mut acc[..m * row], rows * row, &|i, piece| {
            job(i * rows, piece);
        }),
        None => job(0, &mut acc[..m * row]),
    }
    true
}

/// [`matmul`] with `lda` elements between the starts of A's stored rows: `op(A)[i][p]` is
/// element `i * lda + p` of `a`, or `p * lda + i` when `ta`. A block of rows of a transposed
/// A is then the stored matrix from its first column on, with the whole matrix's row length.
fn matmul_strided(a: &[u8], lda: usize, b: &[u8], t: DType, c: &mut [u8], p: Product) {
    if t == DType::F32 {
        #[cfg(target_arch = "x86_64")]
        if wide::enabled() {
            wide::matmul_f32(a, lda, b, c, p);
            return;
        }
        matmul_f32_layout::<NR>(a, lda, b, c, p);
        return;
    }
    let Product { m, k, n, ta, tb } = p;
    let ai = |i: usize, p: usize| if ta { p * lda + i } else { i * lda + p };
    blocked(c, t, m, n, k, |i, p, j0, acc| {
        let av = load(a, t, ai(i, p));
        for (jj, s) in acc.iter_mut().enumerate() {
            let bi = if tb {
                (j0 + jj) * k + p
            } else {
                p * n + j0 + jj
            };
            *s += av * load(b, t, bi);
        }
    })
}

/// [`matmul_f32`] for the transposes asked for, with `NR` columns per register tile.
#[inline(always)]
fn matmul_f32_layout<const NR: usize>(a: &[u8], lda: usize, b: &[u8], c: &mut [u8], p: Product) {
    let Product { m, k, n, ta, tb } = p;
    match (ta, tb) {
        (false, false) => matmul_f32::<false, false, NR>(a, lda, b, c, m, k, n),
        (false, true) => matmul_f32::<false, true, NR>(a, lda, b, c, m, k, n),
        (true, false) => matmul_f32::<true, false, NR>(a, lda, b, c, m, k, n),
        (true, true) => matmul_f32::<true, true, NR>(a, lda, b, c, m, k, n),
    }
}

/// [`matmul_f32_packed`] for the transposes asked for.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn matmul_f32_packed_layout<const NR: usize, M: Mac>(
    a: &[u8],
    lda: usize,
    b: &[u8],
    c: &mut [u8],
    p: Product,
) {
    let Product { m, k, n, ta, tb } = p;
    if k == 0 {
        // Empty sums: zeros, as the plain loop leaves them.
        c[..4 * m * n].fill(0);
        return;
    }
    match (ta, tb) {
        (false, false) => matmul_f32_packed::<false, false, NR, M>(a, lda, b, c, m, k, n),
        (false, true) => matmul_f32_packed::<false, true, NR, M>(a, lda, b, c, m, k, n),
        (true, false) => matmul_f32_packed::<true, false, NR, M>(a, lda, b, c, m, k, n),
        (true, true) => matmul_f32_packed::<true, true, NR, M>(a, lda, b, c, m, k, n),
    }
}

/// Rows of C that [`matmul_f32`] accumulates together in registers.
const MR: usize = 4;
/// Columns of C that [`matmul_f32`] accumulates together in registers with 128-bit vectors
/// (twice as many with 256-bit ones).
const NR: usize = 8;

#[inline(always)]
fn f32_of(bytes: &[u8]) -> f32 {
    f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// `f32` matmul in tiles of `MR x NR` sums held in registers, each summed from `p = 0` upward
/// (the plain loop's order, so the results are its results, bit for bit). Edge tiles use
/// [`blocked`]'s order too.
#[inline(always)]
fn matmul_f32<const TA: bool, const TB: bool, const NR: usize>(
    a: &[u8],
    lda: usize,
    b: &[u8],
    c: &mut [u8],
    m: usize,
    k: usize,
    n: usize,
) {
    let a_at = |i: usize, p: usize| {
        let q = if TA { p * lda + i } else { i * lda + p };
        f32_of(&a[4 * q..4 * q + 4])
    };
    let b_at = |p: usize, j: usize| {
        let q = if TB { j * k + p } else { p * n + j };
        f32_of(&b[4 * q..4 * q + 4])
    };
    let (m_full, n_full) = (m - m % MR, n - n % NR);
    for i0 in (0..m_full).step_by(MR) {
        // Rows of A for this tile (when A is not transposed, each row is contiguous).
        let a_rows: [&[u8]; MR] = core::array::from_fn(|r| {
            if TA {
                &a[..0]
            } else {
                &a[4 * (i0 + r) * lda..4 * ((i0 + r) * lda + k)]
            }
        });
        for j0 in (0..n_full).step_by(NR) {
            let mut acc = [[0f32; NR]; MR];
            for p in 0..k {
                let bv: [f32; NR] = if TB {
                    core::array::from_fn(|jj| b_at(p, j0 + jj))
                } else {
                    let row = &b[4 * (p * n + j0)..4 * (p * n + j0 + NR)];
                    core::array::from_fn(|jj| f32_of(&row[4 * jj..4 * jj + 4]))
                };
                let av: [f32; MR] = if TA {
                    let col = &a[4 * (p * lda + i0)..4 * (p * lda + i0 + MR)];
                    core::array::from_fn(|r| f32_of(&col[4 * r..4 * r + 4]))
                } else {
                    core::array::from_fn(|r| f32_of(&a_rows[r][4 * p..4 * p + 4]))
                };
                for (acc_row, &x) in acc.iter_mut().zip(&av) {
                    for (s, &y) in acc_row.iter_mut().zip(&bv) {
                        *s += x * y;
                    }
                }
            }
            for (r, acc_row) in acc.iter().enumerate() {
                let out = &mut c[4 * ((i0 + r) * n + j0)..4 * ((i0 + r) * n + j0 + NR)];
                for (o, s) in out.chunks_exact_mut(4).zip(acc_row) {
                    o.copy_from_slice(&s.to_le_bytes());
                }
            }
        }
    }
    // Edges: the last columns of the full rows, then the last rows.
    let edge = |c: &mut [u8], i: usize, j: usize| {
        let mut s = 0f32;
        for p in 0..k {
            s += a_at(i, p) * b_at(p, j);
        }
        c[4 * (i * n + j)..4 * (i * n + j) + 4].copy_from_slice(&s.to_le_bytes());
    };
    for i in 0..m_full {
        for j in n_full..n {
            edge(c, i, j);
        }
    }
    for i in m_full..m {
        for j in 0..n {
            edge(c, i, j);
        }
    }
}

/// The most rows of C in one of the fast kernels' tiles ([`tile_rows`]). With two 256-bit
/// vectors of columns, a tile of 6 rows holds 12 sums in registers (of 16), enough to keep
/// both fused multiply-add pipes of a core busy through each one's latency (4 or 5 cycles:
/// 8 to 10 sums in flight), where 4 rows (8 sums) leave them idle part of the time; each term
/// loads 2 vectors of B and broadcasts 6 values of A. Measured against tiles of 4 rows on the
/// classifier's products as `tessera train` cuts them (AMD EPYC, AVX2, one thread): the first
/// layer's 16-row pieces 1.17x faster, the weight gradients' row blocks 1.4x; the whole
/// training session (`cargo bench --bench session`) about 1.1x.
const TILE_ROWS: usize = 6;

/// Rows of B that [`matmul_f32_packed`] copies into one panel (a block of the sum over `p`).
const KC: usize = 256;

/// [`matmul_f32`] for large operands, in the same order (bit for bit with `M` = [`Separate`];
/// the fast kernels' `Fused` rounds each term once), `KC` rows of B and `NR` columns at a
/// time: every tile of C ([`tile_rows`]) sweeps those rows of B where they are when B is not
/// transposed and the tile is whole, or else a copy of them in a contiguous panel on the stack
/// (zero-padded past the last column, gathered when B is transposed). Each output is still
/// summed from `p = 0` upward in `f32`: a tile's sums go to C after one panel and come back
/// for the next, which rounds nothing (they are `f32` in registers and in C alike). Columns
/// past `n` are computed on zeros and never stored.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn matmul_f32_packed<const TA: bool, const TB: bool, const NR: usize, M: Mac>(
    a: &[u8],
    lda: usize,
    b: &[u8],
    c: &mut [u8],
    m: usize,
    k: usize,
    n: usize,
) {
    // Made (and zeroed: 64 KiB for the widest tiles) only when B must be copied.
    let mut panel: Option<Aligned<[[f32; NR]; KC]>> = None;
    for p0 in (0..k).step_by(KC) {
        let kc = KC.min(k - p0);
        for j0 in (0..n).step_by(NR) {
            let w = NR.min(n - j0);
            let strip = Strip {
                m,
                ldc: n,
                p0,
                kc,
                j0,
                w,
            };
            if !TB && w == NR {
                // Whole tiles of B in place: its rows are read where they are, no copy.
                let rows = &b[4 * (p0 * n + j0)..4 * ((p0 + kc - 1) * n + j0 + NR)];
                tile_rows::<TA, false, NR, M>(a, lda, c, strip, |pp| {
                    let at = 4 * pp * n;
                    let row = &rows[at..at + 4 * NR];
                    core::array::from_fn(|jj| f32_of(&row[4 * jj..4 * jj + 4]))
                });
                continue;
            }
            // Lazily: an eager `get_or_insert` would build (and zero) the panel every time.
            #[allow(clippy::unnecessary_lazy_evaluations)]
            let panel_buf = &mut panel.get_or_insert_with(|| Aligned([[0f32; NR]; KC])).0;
            if TB {
                // B transposed: each column of the panel is a contiguous run of B.
                panel_columns(&mut panel_buf[..kc], &b[4 * (j0 * k + p0)..], k, w);
            } else {
                // The last, partial tile of columns: a run of each row of B.
                panel_rows(&mut panel_buf[..kc], &b[4 * (p0 * n + j0)..], n, w);
            }
            let panel = &panel_buf[..kc];
            tile_rows::<TA, false, NR, M>(a, lda, c, strip, |pp| panel[pp]);
        }
    }
}

/// `C = op(A) . B^T` (B stored (n, k)) for few rows of C: computed as `C^T = B . op(A)^T`,
/// the rows of B (contiguous) taking the place of A's and op(A)^T packed into panels, every
/// tile stored transposed into C. Packing op(A) costs `m * k` copies where the direct way
/// gathers all `n * k` of B; each output is still summed from `p = 0` upward, so the results
/// are [`matmul_f32_packed`]'s bit for bit.
#[inline(always)]
fn matmul_f32_bt_swapped<const TA: bool, const NR: usize, M: Mac>(
    a: &[u8],
    lda: usize,
    b: &[u8],
    c: &mut [u8],
    m: usize,
    k: usize,
    n: usize,
) {
    if k == 0 {
        c[..4 * m * n].fill(0);
        return;
    }
    let mut panel = Aligned([[0f32; NR]; KC]);
    for p0 in (0..k).step_by(KC) {
        let kc = KC.min(k - p0);
        for i0 in (0..m).step_by(NR) {
            let w = NR.min(m - i0);
            let rows = &mut panel.0[..kc];
            if TA {
                // A stored (k, m): the panel's rows are runs of A's stored rows.
                panel_rows(rows, &a[4 * (p0 * lda + i0)..], lda, w);
            } else {
                // A stored (m, k): each column of the panel is a run of one of A's rows.
                panel_columns(rows, &a[4 * (i0 * lda + p0)..], lda, w);
            }
            let panel = &panel.0[..kc];
            // C^T's rows are C's columns: `n` of them, C's rows `n` elements apart.
            let strip = Strip {
                m: n,
                ldc: n,
                p0,
                kc,
                j0: i0,
                w,
            };
            tile_rows::<false, true, NR, M>(b, k, c, strip, |pp| panel[pp]);
        }
    }
}

/// Whether `C = op(A) . B^T` is cheaper as [`matmul_f32_bt_swapped`]: when C has fewer rows
/// than columns, packing op(A) copies less than gathering B.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn swap_pays(m: usize, n: usize, tb: bool) -> bool {
    tb && m < n
}

/// [`matmul_f32_bt_swapped`] for A transposed or not (`p.tb`, B transposed, is taken as
/// true).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn matmul_f32_bt_swapped_layout<const NR: usize, M: Mac>(
    a: &[u8],
    lda: usize,
    b: &[u8],
    c: &mut [u8],
    p: Product,
) {
    let Product { m, k, n, ta, .. } = p;
    if ta {
        matmul_f32_bt_swapped::<true, NR, M>(a, lda, b, c, m, k, n);
    } else {
        matmul_f32_bt_swapped::<false, NR, M>(a, lda, b, c, m, k, n);
    }
}

/// The tiles of C that one call of [`tile_rows`] adds terms to, and where C's elements are.
#[derive(Clone, Copy)]
struct Strip {
    /// Rows of C (of C^T when it is stored transposed).
    m: usize,
    /// Elements between the starts of C's stored rows.
    ldc: usize,
    /// The first term added.
    p0: usize,
    /// How many terms are added.
    kc: usize,
    /// The first column of the tiles.
    j0: usize,
    /// Columns of the tiles, at most their `NR`.
    w: usize,
}

/// Every tile of C's `s.m` rows in columns `j0..j0 + w` (`w <= NR`) adds the terms
/// `p0..p0 + kc` of its sums (all from `s`), `b_row(pp)` giving row `p0 + pp` of op(B) from
/// column `j0` (zeros past `w`). C holds the sums of the earlier terms when `p0 > 0`. Element
/// (x, y) of C is element `x * ldc + y` of `c`, or `y * ldc + x` when `CT` (C stored
/// transposed). The rows are cut into tiles of [`tile_height`] rows, each `NR` wide.
#[inline(always)]
fn tile_rows<const TA: bool, const CT: bool, const NR: usize, M: Mac>(
    a: &[u8],
    lda: usize,
    c: &mut [u8],
    s: Strip,
    b_row: impl Fn(usize) -> [f32; NR],
) {
    let mut i0 = 0;
    while i0 < s.m {
        let rows = tile_height(s.m - i0);
        match rows {
            6 => tile::<6, TA, CT, NR, M>(a, lda, c, s, i0, &b_row),
            5 => tile::<5, TA, CT, NR, M>(a, lda, c, s, i0, &b_row),
            4 => tile::<4, TA, CT, NR, M>(a, lda, c, s, i0, &b_row),
            3 => tile::<3, TA, CT, NR, M>(a, lda, c, s, i0, &b_row),
            2 => tile::<2, TA, CT, NR, M>(a, lda, c, s, i0, &b_row),
            _ => tile::<1, TA, CT, NR, M>(a, lda, c, s, i0, &b_row),
        }
        i0 += rows;
    }
}

/// Rows of C the fast kernels' next tile takes when `left` rows remain: [`TILE_ROWS`] while
/// more than 10 remain, and the rest in at most two tiles (7 or 8 rows as 4 and the rest, 9
/// or 10 as 5 and the rest), so that no tile has fewer than 3 rows unless the product has.
#[inline(always)]
fn tile_height(left: usize) -> usize {
    match left {
        0..=6 => left,
        7 | 8 => 4,
        9 | 10 => 5,
        _ => TILE_ROWS,
    }
}

/// The tile of rows `i0..i0 + R` of [`tile_rows`]' strip `s`: its `R x NR` sums held in
/// registers through the sweep over the strip's terms, then stored.
#[inline(always)]
fn tile<const R: usize, const TA: bool, const CT: bool, const NR: usize, M: Mac>(
    a: &[u8],
    lda: usize,
    c: &mut [u8],
    s: Strip,
    i0: usize,
    b_row: &impl Fn(usize) -> [f32; NR],
) {
    let Strip {
        ldc, p0, kc, j0, w, ..
    } = s;
    let c_at = |x: usize, y: usize| 4 * if CT { y * ldc + x } else { x * ldc + y };
    let mut acc = [[0f32; NR]; R];
    if p0 > 0 {
        for (r, acc_row) in acc.iter_mut().enumerate() {
            for (jj, s) in acc_row.iter_mut().enumerate().take(w) {
                let at = c_at(i0 + r, j0 + jj);
                *s = f32_of(&c[at..at + 4]);
            }
        }
    }
    // The sweeps take and return the sums by value, so that they stay in registers.
    let acc = if !TA {
        let a_rows: [&[u8]; R] =
            core::array::from_fn(|r| &a[4 * ((i0 + r) * lda + p0)..4 * ((i0 + r) * lda + p0 + kc)]);
        sweep::<R, NR, M>(acc, kc, b_row, |pp| {
            core::array::from_fn(|r| f32_of(&a_rows[r][4 * pp..4 * pp + 4]))
        })
    } else {
        let cols = &a[4 * (p0 * lda)..4 * ((p0 + kc - 1) * lda + i0 + R)];
        sweep::<R, NR, M>(acc, kc, b_row, |pp| {
            let at = 4 * (pp * lda + i0);
            let col = &cols[at..at + 4 * R];
            core::array::from_fn(|r| f32_of(&col[4 * r..4 * r + 4]))
        })
    };
    if CT {
        // Each row of C gets `R` consecutive sums: the tile's column.
        for jj in 0..w {
            let at = c_at(i0, j0 + jj);
            for (r, acc_row) in acc.iter().enumerate() {
                c[at + 4 * r..at + 4 * r + 4].copy_from_slice(&acc_row[jj].to_le_bytes());
            }
        }
        return;
    }
    for (r, acc_row) in acc.iter().enumerate() {
        let at = c_at(i0 + r, j0);
        if w == NR {
            // A whole row of the tile: one copy of a known size, which the compiler turns
            // into vector stores.
            let bytes = acc_row.map(f32::to_le_bytes);
            c[at..at + 4 * NR].copy_from_slice(bytes.as_flattened());
        } else {
            let out = &mut c[at..at + 4 * w];
            for (o, s) in out.chunks_exact_mut(4).zip(acc_row) {
                o.copy_from_slice(&s.to_le_bytes());
            }
        }
    }
}

/// Of the tile widths `widths` (widest first), the widest whose padding of `n` columns up to
/// a whole number of tiles is no more than the narrowest's.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn tile_columns(n: usize, widths: &[usize]) -> usize {
    let pad = |w: usize| n.div_ceil(w) * w - n;
    let least = widths.iter().map(|&w| pad(w)).min().unwrap_or(0);
    widths
        .iter()
        .copied()
        .find(|&w| pad(w) == least)
        .unwrap_or(1)
}

/// Fills a panel's rows from runs of `src`: row `pp` takes the `w` values from element
/// `pp * stride` on, and zeros after them.
#[inline(always)]
fn panel_rows<const NR: usize>(rows: &mut [[f32; NR]], src: &[u8], stride: usize, w: usize) {
    for (pp, row) in rows.iter_mut().enumerate() {
        let at = 4 * pp * stride;
        let (head, tail) = row.split_at_mut(w);
        for (d, v) in head.iter_mut().zip(src[at..at + 4 * w].chunks_exact(4)) {
            *d = f32_of(v);
        }
        tail.fill(0.0);
    }
}

/// Fills a panel's columns from runs of `src`: column `j < w` takes the `rows.len()` values
/// from element `j * stride` on; the columns after `w` are zeros.
#[inline(always)]
fn panel_columns<const NR: usize>(rows: &mut [[f32; NR]], src: &[u8], stride: usize, w: usize) {
    let len = rows.len();
    for j in 0..NR {
        if j < w {
            let run = &src[4 * j * stride..4 * (j * stride + len)];
            for (row, v) in rows.iter_mut().zip(run.chunks_exact(4)) {
                row[j] = f32_of(v);
            }
        } else {
            rows.iter_mut().for_each(|row| row[j] = 0.0);
        }
    }
}

/// A panel of packed B on a cache line's boundary, so that no vector load of it spans two lines.
#[repr(align(64))]
struct Aligned<T>(T);

/// How a product's term joins its running sum: `mac(s, x, y)` is `s + x * y`, rounded once
/// (`wide::Fused`, on CPUs with fused multiply-add) or twice ([`Separate`]).
trait Mac {
    fn mac(s: f32, x: f32, y: f32) -> f32;
}

/// `s + x * y` as a multiply, then an add: the portable kernels' terms, the same on every CPU.
/// (The tiled kernels run with it only in tests: the portable path sums in `matmul_f32`.)
#[cfg_attr(not(test), allow(dead_code))]
struct Separate;

impl Mac for Separate {
    #[inline(always)]
    fn mac(s: f32, x: f32, y: f32) -> f32 {
        s + x * y
    }
}

/// A tile's sums over `kc` terms: term `pp` adds `a(pp)[r] * b(pp)[j]` to `acc[r][j]` as
/// `M::mac` joins them, for `pp` from 0 upward.
#[inline(always)]
fn sweep<const R: usize, const NR: usize, M: Mac>(
    mut acc: [[f32; NR]; R],
    kc: usize,
    b: impl Fn(usize) -> [f32; NR],
    a: impl Fn(usize) -> [f32; R],
) -> [[f32; NR]; R] {
    for pp in 0..kc {
        let (av, bv) = (a(pp), b(pp));
        for (acc_row, &x) in acc.iter_mut().zip(&av) {
            for (s, &y) in acc_row.iter_mut().zip(&bv) {
                *s = M::mac(*s, x, y);
            }
        }
    }
    acc
}

/// The loop nest of [`matmul`]: for each row `i` of C and block of up to [`BLOCK`] columns
/// from `j0`, `step(i, p, j0, acc)` adds term `p` to the block's sums, for `p` from 0 upward.
/// The block's sums proceed side by side in registers, each still in ascending `p`.
fn blocked(
    c: &mut [u8],
    t: DType,
    m: usize,
    n: usize,
    k: usize,
    mut step: impl FnMut(usize, usize, usize, &mut [f32]),
) {
    let mut acc = [0f32; BLOCK];
    for i in 0..m {
        let mut j0 = 0;
        while j0 < n {
            let w = BLOCK.min(n - j0);
            let acc = &mut acc[..w];
            acc.fill(0.0);
            for p in 0..k {
                step(i, p, j0, acc);
            }
            for (jj, &s) in acc.iter().enumerate() {
                store(c, t, i * n + j0 + jj, s);
            }
            j0 += w;
        }
    }
}

/// 256-bit vectors and fused multiply-adds for the `f32` matmul on x86-64 CPUs that have
/// AVX2 and FMA, and 512-bit vectors on those that have AVX-512F and FMA, chosen at run time.
///
/// The core cannot detect CPU features without `std`, so a host that has detected them says
/// so with [`wide::use_avx2`] or [`wide::use_avx512`]. The kernels are the portable tiled ones
/// (`matmul_f32_packed`, and `matmul_f32_bt_swapped` for a transposed B with fewer rows of C
/// than columns), compiled for those vectors, with tiles of up to 6 rows (`TILE_ROWS`) and 16
/// columns (AVX2) or 16, 32 or 64 (AVX-512, `tile_columns`), each term joined to its sum by
/// one fused multiply-add (`Fused`): `s + x * y` rounded once, as BLAS libraries and XLA
/// compute it, instead of a multiply and an add rounded apart. A multiply and an add keep every
/// floating-point pipe of a core busy where a fused multiply-add needs half of them: measured
/// 1.35x on the 32 x 784 x 256 product of the classifier's first layer (AMD Zen 4).
///
/// Each output is still summed from `p = 0` upward, so the results are exactly those of the
/// plain loop with fused terms (tests/kernels.rs), the same on every CPU that takes this path,
/// on one thread or many. They differ from the portable kernels' (and from a CPU without FMA)
/// in the last bits, as the two roundings differ.
#[cfg(target_arch = "x86_64")]
pub mod wide {
    use core::sync::atomic::{AtomicBool, Ordering};

    static AVX2: AtomicBool = AtomicBool::new(false);
    static AVX512: AtomicBool = AtomicBool::new(false);

    /// Lets the `f32` matmul use AVX2 and FMA.
    ///
    /// # Safety
    ///
    /// The CPU running the program must support AVX2 and FMA (and the OS must save their
    /// registers): call this only after `std::is_x86_feature_detected!("avx2")` and
    /// `std::is_x86_feature_detected!("fma")` returned true.
    #[allow(unsafe_code)]
    pub unsafe fn use_avx2() {
        AVX2.store(true, Ordering::Relaxed);
    }

    /// Lets the `f32` matmul use AVX-512 (512-bit vectors) and FMA.
    ///
    /// # Safety
    ///
    /// The CPU running the program must support AVX-512F and FMA: call this only after
    /// `std::is_x86_feature_detected!("avx512f")` and `std::is_x86_feature_detected!("fma")`
    /// returned true.
    #[allow(unsafe_code)]
    pub unsafe fn use_avx512() {
        AVX512.store(true, Ordering::Relaxed);
    }

    /// `s + x * y` rounded once: the fused multiply-add instruction. Named only here, by the
    /// kernels below, which enable FMA (and inline it in optimised builds).
    struct Fused;

    impl super::Mac for Fused {
        #[inline(always)]
        fn mac(s: f32, x: f32, y: f32) -> f32 {
            use core::arch::x86_64::{_mm_cvtss_f32, _mm_fmadd_ss, _mm_set_ss};
            // Measured need: a fused multiply-add per term makes the classifier's products
            // 1.35x faster than a multiply and an add (see the module's documentation);
            // inlined into the kernels, the compiler turns these scalar operations into
            // vector ones.
            #[allow(unsafe_code)]
            // SAFETY: `Fused` is private to this module, whose kernels run only after the host
            // detected FMA (`use_avx2` and `use_avx512`'s contracts).
            unsafe {
                _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(x), _mm_set_ss(y), _mm_set_ss(s)))
            }
        }
    }

    /// Whether [`use_avx2`] or [`use_avx512`] was called.
    pub fn enabled() -> bool {
        AVX2.load(Ordering::Relaxed) || AVX512.load(Ordering::Relaxed)
    }

    pub(super) fn matmul_f32(a: &[u8], lda: usize, b: &[u8], c: &mut [u8], p: super::Product) {
        // Measured need: 2-3x on the classifier's training step. The flags' contracts make the
        // call sound: each is only set once its features were detected.
        #[allow(unsafe_code)]
        // SAFETY: `AVX512` is only set by `use_avx512`, whose caller guarantees AVX-512F and
        // FMA support; `AVX2` (the other case: `enabled()` was true) only by `use_avx2`,
        // whose caller guarantees AVX2 and FMA support.
        unsafe {
            if AVX512.load(Ordering::Relaxed) {
                avx512(a, lda, b, c, p)
            } else {
                avx2(a, lda, b, c, p)
            }
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    fn avx512(a: &[u8], lda: usize, b: &[u8], c: &mut [u8], p: super::Product) {
        // Tiles one, two or four vectors wide: the widest that pads `n` no more than a
        // narrower one would (wider tiles load fewer operands per multiply; padded columns are
        // computed on zeros and thrown away).
        if super::swap_pays(p.m, p.n, p.tb) {
            // C's rows are the tiles' columns.
            match super::tile_columns(p.m, &[64, 32, 16]) {
                64 => super::matmul_f32_bt_swapped_layout::<64, Fused>(a, lda, b, c, p),
                32 => super::matmul_f32_bt_swapped_layout::<32, Fused>(a, lda, b, c, p),
                _ => super::matmul_f32_bt_swapped_layout::<16, Fused>(a, lda, b, c, p),
            }
            return;
        }
        match super::tile_columns(p.n, &[64, 32, 16]) {
            64 => super::matmul_f32_packed_layout::<64, Fused>(a, lda, b, c, p),
            32 => super::matmul_f32_packed_layout::<32, Fused>(a, lda, b, c, p),
            _ => super::matmul_f32_packed_layout::<16, Fused>(a, lda, b, c, p),
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn avx2(a: &[u8], lda: usize, b: &[u8], c: &mut [u8], p: super::Product) {
        const W: usize = 2 * super::NR;
        if super::swap_pays(p.m, p.n, p.tb) {
            super::matmul_f32_bt_swapped_layout::<W, Fused>(a, lda, b, c, p);
        } else {
            super::matmul_f32_packed_layout::<W, Fused>(a, lda, b, c, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<const K: usize>(v: [f32; K]) -> [[u8; 4]; K] {
        v.map(f32::to_le_bytes)
    }

    #[test]
    fn tile_columns_takes_the_widest_tile_that_pads_least() {
        let widths = [64, 32, 16];
        assert_eq!(tile_columns(256, &widths), 64);
        assert_eq!(tile_columns(100, &widths), 16); // pads 28, 28, 12
        assert_eq!(tile_columns(96, &widths), 32); // pads 32, 0, 0
        assert_eq!(tile_columns(10, &widths), 16);
        assert_eq!(tile_columns(0, &widths), 64);
        assert_eq!(tile_columns(7, &[]), 1);
    }

    #[test]
    fn matmul_all_transposes_agree_with_naive() {
        // A 2x3, B 3x2.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let at = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0];
        let bt = [7.0, 9.0, 11.0, 8.0, 10.0, 12.0];
        let want = [58.0, 64.0, 139.0, 154.0];
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let aa = bytes(if ta { at } else { a });
            let bb = bytes(if tb { bt } else { b });
            let mut c = [0u8; 16];
            let p = Product {
                m: 2,
                k: 3,
                n: 2,
                ta,
                tb,
            };
            matmul(aa.as_flattened(), bb.as_flattened(), DType::F32, &mut c, p);
            for (i, w) in want.iter().enumerate() {
                assert_eq!(load(&c, DType::F32, i), *w, "ta={ta} tb={tb}");
            }
        }
    }

    /// The plain loop's output `(i, j)`: summed from `p = 0` upward, starting at zero.
    fn plain_at(a: &[u8], b: &[u8], p: Product, i: usize, j: usize) -> u32 {
        let Product { m, k, n, ta, tb } = p;
        let mut s = 0f32;
        for p in 0..k {
            let av = load(a, DType::F32, if ta { p * m + i } else { i * k + p });
            let bv = load(b, DType::F32, if tb { j * k + p } else { p * n + j });
            s += av * bv;
        }
        s.to_bits()
    }

    #[test]
    fn packed_f32_matmul_is_the_plain_loop_bit_for_bit() {
        // More than one panel of p (k > KC), ragged rows and columns, n below one tile, k = 0,
        // values whose sums round differently in any other order, and -0.0 products.
        let val = |i: usize| ((i * 7919 % 1013) as f32 - 506.0) / 7.3;
        let mut a = [0u8; 4 * 9600];
        let mut b = [0u8; 4 * 22200];
        for (m, k, n) in [
            (9, 7, 19),
            (6, 600, 37),
            (32, 300, 10),
            (5, 1, 3),
            (4, 0, 5),
            // Whole tiles of 64 columns, read from B in place; k > KC.
            (6, 300, 64),
            (10, 260, 64),
            // Every tile height: 1, 2 and 3 rows alone, 7 = 4 + 3, 8 = 4 + 4, 11 = 6 + 5,
            // 13 = 6 + 4 + 3.
            (1, 40, 20),
            (2, 9, 17),
            (3, 5, 16),
            (7, 11, 16),
            (8, 30, 33),
            (11, 20, 18),
            (13, 17, 16),
        ] {
            for i in 0..m * k {
                store(&mut a, DType::F32, i, val(i));
            }
            for i in 0..k * n {
                let v = if i % 5 == 0 { -0.0 } else { val(i + 3) * 1e-3 };
                store(&mut b, DType::F32, i, v);
            }
            let (a, b) = (&a[..4 * m * k], &b[..4 * k * n]);
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let p = Product { m, k, n, ta, tb };
                let lda = p.lda();
                let mut c16 = [0xffu8; 4 * 640];
                matmul_f32_packed_layout::<16, Separate>(a, lda, b, &mut c16, p);
                let mut c32 = [0xffu8; 4 * 640];
                matmul_f32_packed_layout::<32, Separate>(a, lda, b, &mut c32, p);
                let mut c64 = [0xffu8; 4 * 640];
                matmul_f32_packed_layout::<64, Separate>(a, lda, b, &mut c64, p);
                // B transposed: also C^T = B . op(A)^T, whatever the shape.
                let (mut s16, mut s32) = ([0xffu8; 4 * 640], [0xffu8; 4 * 640]);
                let mut s64 = [0xffu8; 4 * 640];
                if tb {
                    matmul_f32_bt_swapped_layout::<16, Separate>(a, lda, b, &mut s16, p);
                    matmul_f32_bt_swapped_layout::<32, Separate>(a, lda, b, &mut s32, p);
                    matmul_f32_bt_swapped_layout::<64, Separate>(a, lda, b, &mut s64, p);
                }
                for i in 0..m {
                    for j in 0..n {
                        let want = plain_at(a, b, p, i, j);
                        let at = |c: &[u8]| load(c, DType::F32, i * n + j).to_bits();
                        let swapped = [
                            ("swapped, NR=16", &s16),
                            ("swapped, NR=32", &s32),
                            ("swapped, NR=64", &s64),
                        ];
                        let swapped = if tb { &swapped[..] } else { &[] };
                        let direct = [("NR=16", &c16), ("NR=32", &c32), ("NR=64", &c64)];
                        for &(nr, c) in direct.iter().chain(swapped) {
                            assert_eq!(
                                at(c),
                                want,
                                "{nr} ({m}, {k}, {n}) ta={ta} tb={tb} ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Claims three threads and runs the pieces last first, as a pool may.
    struct Backwards;

    impl Parallel for Backwards {
        fn threads(&self) -> usize {
            3
        }

        fn for_each_piece(
            &self,
            out: &mut [u8],
            piece: usize,
            job: &(dyn Fn(usize, &mut [u8]) + Sync),
        ) {
            for (i, p) in out.chunks_mut(piece).enumerate().rev() {
                job(i, p);
            }
        }
    }

    #[test]
    fn products_cut_into_pieces_are_the_whole_products_bit_for_bit() {
        // Rows that are not a multiple of the pieces or of the register tile; f32 (the tiled
        // kernels) and f16 (the generic loop).
        let val = |i: usize| ((i * 7919 % 1013) as f32 - 506.0) / 7.3;
        let mut a = [0u8; 4 * 24_000];
        let mut b = [0u8; 4 * 36_000];
        for (m, k, n) in [(41, 120, 70), (13, 220, 96), (8, 3000, 12)] {
            for t in [DType::F32, DType::F16] {
                for i in 0..m * k {
                    store(&mut a, t, i, val(i) * 1e-2);
                }
                for i in 0..k * n {
                    store(&mut b, t, i, val(i + 3) * 1e-2);
                }
                assert!(m * k * n >= 2 * PIECE_MIN_MACS, "({m}, {k}, {n}) is cut");
                // Exactly the operands' bytes: a read past them panics.
                let (a, b) = (&a[..m * k * t.size()], &b[..k * n * t.size()]);
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    let p = Product { m, k, n, ta, tb };
                    let mut whole = [0u8; 4 * 3000];
                    matmul(a, b, t, &mut whole, p);
                    let mut cut = [0xffu8; 4 * 3000];
                    matmul_on(&Backwards, a, b, t, &mut cut, p);
                    let len = m * n * t.size();
                    assert!(
                        whole[..len] == cut[..len],
                        "{t:?} ({m}, {k}, {n}) ta={ta} tb={tb}"
                    );
                    let mut serial = [0xffu8; 4 * 3000];
                    matmul_on(&Serial, a, b, t, &mut serial, p);
                    assert!(
                        whole[..len] == serial[..len],
                        "{t:?} ({m}, {k}, {n}) serial"
                    );
                }
            }
        }
    }

    #[test]
    fn elementwise_updates_cut_into_pieces_are_the_whole_ones_bit_for_bit() {
        let n = ZIP_MIN_ELEMENTS + 37;
        let mut x = [0u8; 4 * (ZIP_MIN_ELEMENTS + 37)];
        let mut y = [0u8; 4 * (ZIP_MIN_ELEMENTS + 37)];
        for i in 0..n {
            store(&mut x, DType::F32, i, (i % 1013) as f32 / 7.3);
            store(&mut y, DType::F32, i, (i % 997) as f32 / 3.1);
        }
        let mut whole = x;
        zip_in_place(&mut whole, &y, DType::F32, n, |a, g| a * 0.9 + g / 3.0);
        zip_in_place_on(&Backwards, &mut x, &y, DType::F32, n, |a, g| {
            a * 0.9 + g / 3.0
        });
        assert!(x == whole);
    }

    #[test]
    fn products_summed_into_an_accumulator_are_the_product_then_the_sum_bit_for_bit() {
        // Blocks of the stack buffer, pieces, ragged rows and every transpose; f32 and f16.
        let val = |i: usize| ((i * 7919 % 1013) as f32 - 506.0) / 7.3;
        let mut a = [0u8; 4 * 5_000];
        let mut b = [0u8; 4 * 20_000];
        let mut acc = [0u8; 4 * 30_000];
        let mut product = [0u8; 4 * 30_000];
        // The last is too wide for the buffer in f32, not in f16.
        for (m, k, n) in [(150, 33, 190), (61, 40, 70), (7, 5, 9), (20, 16, 1030)] {
            for t in [DType::F32, DType::F16] {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    for i in 0..m * k {
                        store(&mut a, t, i, val(i) * 1e-2);
                    }
                    for i in 0..k * n {
                        store(&mut b, t, i, val(i + 5) * 1e-2);
                    }
                    for i in 0..m * n {
                        store(&mut acc, t, i, val(i + 11));
                    }
                    let (a, b) = (&a[..m * k * t.size()], &b[..k * n * t.size()]);
                    let c = &mut product[..m * n * t.size()];
                    let p = Product { m, k, n, ta, tb };
                    matmul(a, b, t, c, p);
                    let mut expected = acc;
                    zip_in_place(&mut expected, c, t, m * n, |a, g| a + g);
                    let fits = accumulates_rows_of(t, n);
                    for par in [&Serial as &dyn Parallel, &Backwards] {
                        let mut got = acc;
                        let done = matmul_accumulate_on(par, a, b, t, &mut got, p);
                        assert_eq!(done, fits, "({m}, {k}, {n}) {t:?}");
                        let want = if fits { &expected } else { &acc };
                        assert!(got == *want, "({m}, {k}, {n}) {t:?} ta {ta} tb {tb}");
                    }
                }
            }
        }
        assert!(!accumulates_rows_of(DType::F32, 1025));
    }

    #[test]
    fn fills_cut_into_pieces_store_the_value_into_every_element() {
        // Past the cutting threshold and not a multiple of the pieces; every element type, a
        // zero (one memory fill), a negative zero and another value.
        let n = ZIP_MIN_ELEMENTS + 37;
        let mut x = [0xA5u8; 4 * (ZIP_MIN_ELEMENTS + 37) + 3];
        let mut expected = [0xA5u8; 4 * (ZIP_MIN_ELEMENTS + 37) + 3];
        for t in [DType::F32, DType::F16, DType::I32, DType::U8] {
            for value in [0.0, -0.0, 2.75] {
                for len in [n, 1000] {
                    x.fill(0xA5);
                    expected.fill(0xA5);
                    for i in 0..len {
                        store(&mut expected, t, i, value);
                    }
                    fill_on(&Backwards, &mut x, t, len, value);
                    assert!(x == expected, "{t:?} {value} {len}");
                    x.fill(0xA5);
                    fill_on(&Serial, &mut x, t, len, value);
                    assert!(x == expected, "{t:?} {value} {len}, serial");
                }
            }
        }
    }

    #[test]
    fn tiled_f32_matmul_is_the_plain_loop_bit_for_bit() {
        // Shapes with full register tiles and ragged edges, every transpose.
        const M: usize = 9;
        const K: usize = 7;
        const N: usize = 19;
        let val = |i: usize| ((i * 37 % 23) as f32 - 11.0) / 7.0;
        let mut a = [0u8; 4 * M * K];
        let mut b = [0u8; 4 * K * N];
        for i in 0..M * K {
            store(&mut a, DType::F32, i, val(i));
        }
        for i in 0..K * N {
            store(&mut b, DType::F32, i, val(i + 5) * 1.3);
        }
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let mut c = [0u8; 4 * M * N];
            let p = Product {
                m: M,
                k: K,
                n: N,
                ta,
                tb,
            };
            matmul(&a, &b, DType::F32, &mut c, p);
            for i in 0..M {
                for j in 0..N {
                    let mut s = 0f32;
                    for p in 0..K {
                        let av = load(&a, DType::F32, if ta { p * M + i } else { i * K + p });
                        let bv = load(&b, DType::F32, if tb { j * K + p } else { p * N + j });
                        s += av * bv;
                    }
                    let got = load(&c, DType::F32, i * N + j);
                    assert_eq!(got.to_bits(), s.to_bits(), "ta={ta} tb={tb} ({i}, {j})");
                }
            }
        }
    }
}
