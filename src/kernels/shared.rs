//! Shared inputs and outputs of the fused ops ([`Shared`]): tensors that many steps read, whose gradients
//! accumulate in place instead of travelling through candle's gradient store, with the taps that hand
//! them back to the graph.

use super::*;

/// A gradient accumulated in place across decoder steps.
#[derive(Default)]
pub enum AccBuf {
    #[default]
    Empty,
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// A large per-sentence tensor that every decoder step reads (the annotations, the attention keys `A h_j`).
/// With autodiff, the steps' fused backward passes add their gradient for it into one buffer in place, and
/// the tensor receives that sum once, instead of one `[B, S, ·]` gradient tensor allocated and added per
/// step. `token` is the one-element graph handle the steps take as their input in its place.
#[derive(Clone)]
pub struct Shared {
    pub tensor: Tensor,
    pub token: Tensor,
    pub acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
}

impl Shared {
    pub fn new(x: &Tensor) -> Result<Shared> {
        let tensor = x.contiguous()?;
        let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
        let token = tensor.apply_op1(ShareTap { acc: acc.clone() })?;
        Ok(Shared { tensor, token, acc })
    }

    /// Block `i` of the first dimension (`[n, …]` → `[…]`, e.g. one time step of a time-major tensor) as a
    /// graph node whose gradient is added in place into the shared buffer: no full-size gradient per step.
    pub fn index(&self, i: usize) -> Result<Tensor> {
        self.token.apply_op1(StepSlice {
            shared: self.clone(),
            i,
        })
    }

    /// The tensor's storage as a slice (for a fused kernel's forward pass).
    pub fn with_slice<T: Real, R>(&self, f: impl FnOnce(&[T]) -> Result<R>) -> Result<R> {
        let (st, l) = self.tensor.storage_and_layout();
        match &*st {
            candle_core::Storage::Cpu(c) => f(slice::<T>(c, l)?),
            _ => candle_core::bail!("shared tensor is not on the CPU"),
        }
    }

    /// Add `g` (this tensor's shape, flattened) into the accumulated gradient.
    pub fn add_grad<T: Real>(&self, g: Vec<T>) {
        let mut acc = self.acc.lock().expect("gradient accumulator");
        let n = self.tensor.elem_count();
        assert_eq!(g.len(), n, "shared input: gradient size");
        if matches!(*acc, AccBuf::Empty) {
            // The first contribution becomes the accumulator (no zero-filled buffer, no pass over it).
            *acc = T::acc_from(g);
            return;
        }
        for (a, x) in T::acc_slice(&mut acc, n).iter_mut().zip(g) {
            *a += x;
        }
    }

    /// Add `f`'s contribution into the accumulated gradient (zero-initialised on first use).
    pub fn accumulate<T: Real>(&self, f: impl FnOnce(&mut [T])) {
        let mut acc = self.acc.lock().expect("gradient accumulator");
        f(T::acc_slice(&mut acc, self.tensor.elem_count()));
    }
}

/// A fused op's large input: a graph tensor (the op wraps it in a [`Shared`] handle) or a handle its producer
/// made ([`linear_shared`]), whose gradient then never enters candle's gradient store.
pub enum Input<'a> {
    Tensor(&'a Tensor),
    Shared(Shared),
}

impl<'a> From<&'a Tensor> for Input<'a> {
    fn from(t: &'a Tensor) -> Self {
        Input::Tensor(t)
    }
}

impl From<Shared> for Input<'_> {
    fn from(s: Shared) -> Self {
        Input::Shared(s)
    }
}

impl Input<'_> {
    /// The input's value.
    pub fn tensor(&self) -> &Tensor {
        match self {
            Input::Tensor(t) => t,
            Input::Shared(s) => &s.tensor,
        }
    }
    /// The handle the op reads it through.
    pub fn into_shared(self) -> Result<Shared> {
        match self {
            Input::Tensor(t) => Shared::new(t),
            Input::Shared(s) => Ok(s),
        }
    }
}

/// `x W + b` as the [`Shared`] input of a fused op: the product is formed now, outside the graph, and the graph
/// holds a one-element token whose backward pass takes the gradient the consumer accumulated in the handle
/// and returns `∂x`, `∂W`, `∂b`. Compared with [`linear`] feeding a [`Shared::new`] handle, the product's
/// gradient (`[N, M]`, multi-megabyte for the sequence ops' projections) is never zero-filled and added in
/// candle's gradient store.
pub fn linear_shared(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Shared> {
    linear_shared_rows(x, w, b, None)
}

/// Rows of a `[N, ·]` operand, in increasing order.
pub type Rows = std::sync::Arc<Vec<usize>>;

/// [`linear_shared`] over rows `rows` of `x` only (`None`: all): the result is `[rows.len(), M]`, row `i` being
/// `x`'s row `rows[i]` times `W` plus `b` (for a consumer that reads some rows only, such as the words'
/// positions of a padded batch); the other rows of `x` get zero gradient.
pub fn linear_shared_rows(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    rows: Option<Rows>,
) -> Result<Shared> {
    let (x, w, b) = (x.contiguous()?, w.contiguous()?, b.contiguous()?);
    check_rows(rows.as_ref(), x.dims2()?.0, "linear over rows")?;
    let tensor = match &rows {
        None => x
            .detach()
            .apply_op3(&w.detach(), &b.detach(), Linear(None, None))?,
        Some(r) => x
            .detach()
            .apply_op3(&w.detach(), &b.detach(), Linear(Some(r.clone()), None))?,
    };
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let token = x.apply_op3(
        &w,
        &b,
        LinearTap {
            acc: acc.clone(),
            rows,
        },
    )?;
    Ok(Shared { tensor, token, acc })
}

/// `rows` must be increasing and below `n`.
pub(super) fn check_rows(rows: Option<&Rows>, n: usize, what: &str) -> Result<()> {
    match rows {
        Some(r) if r.windows(2).any(|p| p[0] >= p[1]) || r.last().is_some_and(|&l| l >= n) => {
            candle_core::bail!("{what}: rows out of order or beyond {n}")
        }
        _ => Ok(()),
    }
}

/// Rows `rows` of `x` `[N, w]`, gathered.
pub(super) fn gather_rows<T: Copy>(x: &[T], w: usize, rows: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len() * w);
    for &r in rows {
        out.extend_from_slice(&x[r * w..(r + 1) * w]);
    }
    out
}

/// Where a fused op's forward pass leaves its activations for the backward pass.
pub(crate) type SavedSlot = std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>;

/// The activations the forward pass left in `slot`, taken out (one backward pass per forward pass); `op` names
/// the op in the error when there are none or they are of another dtype.
pub(crate) fn take_saved<S: 'static>(slot: &SavedSlot, op: &str) -> Result<S> {
    let saved = slot
        .lock()
        .expect("saved activations")
        .take()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: no saved forward pass")))?;
    saved
        .downcast::<S>()
        .map(|b| *b)
        .map_err(|_| candle_core::Error::Msg(format!("{op}: dtype")))
}

/// A fused op that can hand its output to its consumers as a [`Shared`] handle ([`shared_output`]).
pub(crate) trait FusedOutput: Send + Sync + 'static {
    /// The op's forward and backward names in `cgnmt bench --profile-ops`.
    fn profile_names(&self) -> (&'static str, &'static str);
    /// The output, computed from the op's inputs.
    fn forward_output(&self) -> Result<(CpuStorage, Shape)>;
    /// The backward pass for the output's gradient `grad`: every input's gradient goes to its handle.
    fn backward_output(&self, grad: &Tensor) -> Result<()>;
}

/// `op`'s output as a [`Shared`] handle: formed now, outside the graph; the graph holds a one-element token
/// on `bundle` (the concatenation of the op's inputs' tokens) whose backward pass runs the op's backward pass
/// on the gradient the consumers accumulated in the handle — the output's gradient, multi-megabyte for the
/// sequence ops, is never zero-filled and added in candle's gradient store.
pub(crate) fn shared_output<O: FusedOutput>(op: O, bundle: &Tensor) -> Result<Shared> {
    let (fwd_name, _) = op.profile_names();
    let (storage, shape) = crate::kernels::profile::timed(fwd_name, || op.forward_output())?;
    let dev = bundle.device();
    let tensor = match storage {
        CpuStorage::F32(v) => Tensor::from_vec(v, shape.clone(), dev)?,
        CpuStorage::F64(v) => Tensor::from_vec(v, shape.clone(), dev)?,
        _ => candle_core::bail!("fused kernels support f32 and f64"),
    };
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let token = bundle.apply_op1(OutputTap {
        op,
        acc: acc.clone(),
        shape,
    })?;
    Ok(Shared { tensor, token, acc })
}

struct OutputTap<O> {
    op: O,
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    shape: Shape,
}

impl<O: FusedOutput> candle_core::CustomOp1 for OutputTap<O> {
    fn name(&self) -> &'static str {
        "fused-op-shared-output"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        token_storage(s)
    }
    fn bwd(&self, bundle: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let (_, bwd_name) = self.op.profile_names();
        crate::kernels::profile::timed(bwd_name, || {
            let g = take_accumulated(
                &self.acc,
                self.shape.clone(),
                bundle.dtype(),
                bundle.device(),
            )?;
            if let Some(g) = g {
                self.op.backward_output(&g)?;
            }
            Ok(Some(bundle.zeros_like()?))
        })
    }
}

/// `x W` over the last dimension of a [`Shared`] input `x` (`[…, K]` × `[K, M]` → `[…, M]`), itself as a
/// [`Shared`] handle: formed now, outside the graph; the graph holds a one-element token (on `x`'s token and
/// `W`) whose backward pass takes the gradient accumulated in the result's handle, adds `∂x = ∂y Wᵀ` into
/// `x`'s handle and hands `∂W = xᵀ ∂y` over. Neither `[N, K]` nor `[N, M]` gradient enters candle's store.
pub fn product_shared(x: &Shared, w: &Tensor) -> Result<Shared> {
    product_shared_rows(x, w, None)
}

/// [`product_shared`] over rows `rows` of `x` viewed as `[N, K]` (`None`: all): the result is
/// `[rows.len(), M]`, row `i` being `x`'s row `rows[i]` times `W` (for a consumer that reads some rows only,
/// such as the words' positions of a padded batch); the other rows of `x` get no gradient from it.
pub fn product_shared_rows(x: &Shared, w: &Tensor, rows: Option<Rows>) -> Result<Shared> {
    let w = w.contiguous()?;
    let (k, m) = w.dims2()?;
    let dims = x.tensor.dims();
    if dims.last() != Some(&k) {
        candle_core::bail!("shared product: {:?} × [{k}, {m}]", dims);
    }
    let n = x.tensor.elem_count() / k.max(1);
    check_rows(rows.as_ref(), n, "shared product over rows")?;
    let out_dims = match &rows {
        None => {
            let mut d = dims.to_vec();
            *d.last_mut().expect("rank ≥ 1") = m;
            d
        }
        Some(r) => vec![r.len(), m],
    };
    fn run<T: Real>(x: &Shared, w: &Tensor, rows: Option<&[usize]>, n: usize) -> Result<Vec<T>> {
        let (k, m) = w.dims2()?;
        let (ws, wl) = w.storage_and_layout();
        let wd = storage_slice::<T>(&ws, wl)?;
        x.with_slice::<T, _>(|xd| {
            Ok(match rows {
                None => product(n, m, k, Mat::rows(xd, k), Mat::rows(wd, m)),
                Some(r) => {
                    let xg = gather_rows(xd, k, r);
                    product(r.len(), m, k, Mat::rows(&xg, k), Mat::rows(wd, m))
                }
            })
        })
    }
    let tensor = crate::kernels::profile::timed("shared product forward", || match w.dtype() {
        candle_core::DType::F32 => Tensor::from_vec(
            run::<f32>(x, &w, rows.as_deref().map(|r| r.as_slice()), n)?,
            out_dims,
            w.device(),
        ),
        candle_core::DType::F64 => Tensor::from_vec(
            run::<f64>(x, &w, rows.as_deref().map(|r| r.as_slice()), n)?,
            out_dims,
            w.device(),
        ),
        _ => candle_core::bail!("fused kernels support f32 and f64"),
    })?;
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let n_out = rows.as_ref().map_or(n, |r| r.len());
    let token = x.token.apply_op2(
        &w,
        ProductTap {
            x: x.clone(),
            acc: acc.clone(),
            n: n_out,
            rows,
        },
    )?;
    Ok(Shared { tensor, token, acc })
}

struct ProductTap {
    x: Shared,
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    /// Rows of the result (`x`'s, viewed as `[N, K]`, or `rows.len()`).
    n: usize,
    /// The rows of `x` formed (see [`product_shared_rows`]).
    rows: Option<Rows>,
}

impl ProductTap {
    fn backward<T: Real>(&self, w: &Tensor, g: &Tensor) -> Result<Tensor> {
        let (k, m) = w.dims2()?;
        let n = self.n;
        let (ws, wl) = w.storage_and_layout();
        let wd = storage_slice::<T>(&ws, wl)?;
        let (gs, gl) = g.storage_and_layout();
        let gd = storage_slice::<T>(&gs, gl)?;
        let Some(rows) = &self.rows else {
            // ∂x += ∂y Wᵀ, in place in x's handle.
            self.x.accumulate::<T>(|dx| {
                gemm_into(n, k, m, dx, k, true, Mat::rows(gd, m), Mat::t(wd, m))
            });
            let dw = self
                .x
                .with_slice::<T, _>(|xd| Ok(product(k, m, n, Mat::t(xd, k), Mat::rows(gd, m))))?;
            return Tensor::from_vec(dw, (k, m), w.device());
        };
        // The rows' ∂x = ∂y Wᵀ, added into theirs in x's handle; ∂W = x_rowsᵀ ∂y.
        let dxr = product(n, k, m, Mat::rows(gd, m), Mat::t(wd, m));
        self.x.accumulate::<T>(|dx| {
            use rayon::prelude::*;
            let dxw = RowsMut::new(dx, k);
            rows.par_iter().enumerate().for_each(|(i, &r)| {
                // SAFETY: the rows are distinct (checked increasing), one task each.
                let d = unsafe { dxw.row(r) };
                for (a, &x) in d.iter_mut().zip(&dxr[i * k..(i + 1) * k]) {
                    *a += x;
                }
            });
        });
        let dw = self.x.with_slice::<T, _>(|xd| {
            let xg = gather_rows(xd, k, rows);
            Ok(product(k, m, n, Mat::t(&xg, k), Mat::rows(gd, m)))
        })?;
        Tensor::from_vec(dw, (k, m), w.device())
    }
}

impl candle_core::CustomOp2 for ProductTap {
    fn name(&self) -> &'static str {
        "product-shared"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        _l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        token_storage(s1)
    }
    fn bwd(
        &self,
        token: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        crate::kernels::profile::timed("shared product backward", || {
            let m = w.dim(1)?;
            let Some(g) = take_accumulated(&self.acc, (self.n, m), w.dtype(), w.device())? else {
                return Ok((None, None));
            };
            let dw = match w.dtype() {
                candle_core::DType::F32 => self.backward::<f32>(w, &g)?,
                candle_core::DType::F64 => self.backward::<f64>(w, &g)?,
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            Ok((Some(token.zeros_like()?), hand_over(w, dw)))
        })
    }
}

/// `x ⊙ mask` as a [`Shared`] tensor (dropout on a shared tensor, e.g. the annotations, with `mask` of 0 and
/// `1 / (1 − p)` values, `x`'s size): formed now, outside the graph; the consumers add their gradient into the
/// result's handle, and the token's backward pass adds that gradient times the mask into `x`'s handle. Equal
/// to the composed `x · mask` (tested against finite differences through the whole model).
pub fn dropout_shared(x: &Shared, mask: &Tensor) -> Result<Shared> {
    if mask.dims() != x.tensor.dims() {
        candle_core::bail!(
            "shared dropout: mask {:?} for {:?}",
            mask.dims(),
            x.tensor.dims()
        );
    }
    let mask = mask.to_dtype(x.tensor.dtype())?.contiguous()?;
    let tensor = x.tensor.mul(&mask)?;
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let token = x.token.apply_op1(DropoutTap {
        x: x.clone(),
        acc: acc.clone(),
        mask,
    })?;
    Ok(Shared { tensor, token, acc })
}

struct DropoutTap {
    x: Shared,
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    mask: Tensor,
}

impl DropoutTap {
    fn backward<T: Real>(&self, g: &Tensor) -> Result<()> {
        let (gs, gl) = g.storage_and_layout();
        let gd = storage_slice::<T>(&gs, gl)?;
        let (ms, ml) = self.mask.storage_and_layout();
        let md = storage_slice::<T>(&ms, ml)?;
        // ∂x += ∂y ⊙ mask, in place in x's handle.
        self.x.accumulate::<T>(|dx| {
            for ((a, &g), &m) in dx.iter_mut().zip(gd).zip(md) {
                *a += g * m;
            }
        });
        Ok(())
    }
}

impl candle_core::CustomOp1 for DropoutTap {
    fn name(&self) -> &'static str {
        "dropout-shared"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        token_storage(s)
    }
    fn bwd(&self, token: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let Some(g) = take_accumulated(
            &self.acc,
            self.mask.shape().clone(),
            self.mask.dtype(),
            self.mask.device(),
        )?
        else {
            return Ok(None);
        };
        match g.dtype() {
            candle_core::DType::F32 => self.backward::<f32>(&g)?,
            candle_core::DType::F64 => self.backward::<f64>(&g)?,
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
        Ok(Some(token.zeros_like()?))
    }
}

/// Rows `rows` and columns `cols` of a [`Shared`] tensor viewed as `[N, C]` (`C` its last dimension), as a
/// graph node `[rows.len(), cols.len()]` whose gradient is added into the handle (e.g. the backward
/// direction's state at each sentence's first word, read from the annotations).
pub fn shared_rows(x: &Shared, rows: Vec<usize>, cols: std::ops::Range<usize>) -> Result<Tensor> {
    let c = *x.tensor.dims().last().unwrap_or(&0);
    let n = x.tensor.elem_count() / c.max(1);
    if cols.start > cols.end || cols.end > c || rows.iter().any(|&r| r >= n) {
        candle_core::bail!("shared rows: out of bounds of [{n}, {c}]");
    }
    x.token.apply_op1(SharedRows {
        x: x.clone(),
        rows,
        cols,
        c,
    })
}

struct SharedRows {
    x: Shared,
    rows: Vec<usize>,
    cols: std::ops::Range<usize>,
    c: usize,
}

impl SharedRows {
    fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        let w = self.cols.len();
        let v = self.x.with_slice::<T, _>(|xd| {
            Ok(self
                .rows
                .iter()
                .flat_map(|&r| {
                    xd[r * self.c + self.cols.start..r * self.c + self.cols.end]
                        .iter()
                        .copied()
                })
                .collect::<Vec<T>>())
        })?;
        Ok((
            T::to_cpu_storage_owned(v),
            Shape::from((self.rows.len(), w)),
        ))
    }

    fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
        let w = self.cols.len();
        self.x.accumulate::<T>(|acc| {
            for (i, &r) in self.rows.iter().enumerate() {
                let at = r * self.c + self.cols.start;
                for (a, &x) in acc[at..at + w].iter_mut().zip(&g[i * w..(i + 1) * w]) {
                    *a += x;
                }
            }
        });
        Ok(())
    }
}

impl candle_core::CustomOp1 for SharedRows {
    fn name(&self) -> &'static str {
        "shared-rows"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        match s {
            CpuStorage::F32(_) => self.forward::<f32>(),
            CpuStorage::F64(_) => self.forward::<f64>(),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    }
    fn bwd(&self, token: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        match grad.dtype() {
            candle_core::DType::F32 => self.backward::<f32>(grad)?,
            candle_core::DType::F64 => self.backward::<f64>(grad)?,
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
        Ok(Some(token.zeros_like()?))
    }
}

struct LinearTap {
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    /// The rows formed (see [`linear_shared_rows`]).
    rows: Option<Rows>,
}

impl candle_core::CustomOp3 for LinearTap {
    fn name(&self) -> &'static str {
        "linear-shared"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        _l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
        _s3: &CpuStorage,
        _l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        token_storage(s1)
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        crate::kernels::profile::timed("linear backward", || {
            let n = x.dim(0)?;
            let Some(rows) = &self.rows else {
                let shape = (n, w.dim(1)?);
                return match take_accumulated(&self.acc, shape, x.dtype(), x.device())? {
                    Some(g) => linear_grads(x, w, b, &g),
                    None => Ok((None, None, None)),
                };
            };
            // The formed rows' gradients; the other rows' ∂x is zero.
            let shape = (rows.len(), w.dim(1)?);
            let Some(g) = take_accumulated(&self.acc, shape, x.dtype(), x.device())? else {
                return Ok((None, None, None));
            };
            fn pick<T: Real>(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
                let k = x.dim(1)?;
                let v = to_vec::<T>(x)?;
                Tensor::from_vec(gather_rows(&v, k, rows), (rows.len(), k), x.device())
            }
            fn spread<T: Real>(d: &Tensor, rows: &[usize], n: usize) -> Result<Tensor> {
                let k = d.dim(1)?;
                let v = to_vec::<T>(d)?;
                let mut out = zeroed::<T>(n * k);
                for (i, &r) in rows.iter().enumerate() {
                    out[r * k..(r + 1) * k].copy_from_slice(&v[i * k..(i + 1) * k]);
                }
                Tensor::from_vec(out, (n, k), d.device())
            }
            let (xr, f64s) = match x.dtype() {
                candle_core::DType::F32 => (pick::<f32>(x, rows)?, false),
                candle_core::DType::F64 => (pick::<f64>(x, rows)?, true),
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            let (dxr, dw, db) = linear_grads(&xr, w, b, &g)?;
            let dx = match dxr {
                Some(d) if f64s => Some(spread::<f64>(&d, rows, n)?),
                Some(d) => Some(spread::<f32>(&d, rows, n)?),
                None => None,
            };
            Ok((dx, dw, db))
        })
    }
}

struct ShareTap {
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
}

/// The gradient accumulated in a shared handle as a tensor of `shape` (`None` when nothing was added),
/// leaving the accumulator empty.
pub(crate) fn take_accumulated<S: Into<Shape>>(
    acc: &std::sync::Mutex<AccBuf>,
    shape: S,
    dtype: candle_core::DType,
    dev: &Device,
) -> Result<Option<Tensor>> {
    let mut acc = acc.lock().expect("gradient accumulator");
    match dtype {
        candle_core::DType::F32 => f32::acc_take(&mut acc).map(|v| Tensor::from_vec(v, shape, dev)),
        candle_core::DType::F64 => f64::acc_take(&mut acc).map(|v| Tensor::from_vec(v, shape, dev)),
        _ => None,
    }
    .transpose()
}

/// `x W + b`'s gradients for the output gradient `g`: `∂x` to candle, `∂W` and `∂b` handed over.
pub(super) fn linear_grads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    g: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let (dx, dw) = product_grads(x, w, g)?;
    let db = column_sums(g)?;
    Ok((Some(dx), hand_over(w, dw), hand_over(b, db)))
}

impl candle_core::CustomOp1 for ShareTap {
    fn name(&self) -> &'static str {
        "shared-input"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        token_storage(s)
    }
    fn bwd(&self, arg: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let g = take_accumulated(&self.acc, arg.shape(), arg.dtype(), arg.device())?;
        Ok(g.and_then(|g| hand_over(arg, g)))
    }
}

struct StepSlice {
    shared: Shared,
    i: usize,
}

fn step_slice_fwd<T: Real>(sh: &Shared, i: usize) -> Result<(CpuStorage, Shape)> {
    let dims = sh.tensor.dims();
    let n = dims.first().copied().unwrap_or(0);
    if i >= n {
        candle_core::bail!("step slice {i} of a tensor with {n} steps");
    }
    let block = sh.tensor.elem_count() / n;
    let v = sh.with_slice::<T, _>(|x| Ok(x[i * block..(i + 1) * block].to_vec()))?;
    Ok((T::to_cpu_storage_owned(v), Shape::from(dims[1..].to_vec())))
}

fn step_slice_bwd<T: Real>(sh: &Shared, i: usize, grad: &Tensor) -> Result<()> {
    let n = sh.tensor.dim(0)?;
    let block = sh.tensor.elem_count() / n;
    let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
    sh.accumulate::<T>(|acc| {
        for (a, x) in acc[i * block..(i + 1) * block].iter_mut().zip(g) {
            *a += x;
        }
    });
    Ok(())
}

impl candle_core::CustomOp1 for StepSlice {
    fn name(&self) -> &'static str {
        "shared-step-slice"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s, step_slice_fwd, &self.shared, self.i)
    }
    fn bwd(&self, token: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        match grad.dtype() {
            candle_core::DType::F32 => step_slice_bwd::<f32>(&self.shared, self.i, grad)?,
            candle_core::DType::F64 => step_slice_bwd::<f64>(&self.shared, self.i, grad)?,
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
        Ok(Some(token.zeros_like()?))
    }
}
