//! Guided alignment's row maths (model-spec §6b; `train.guided_alignment`): the cost between a target
//! position's attention row `α_i` and its gold alignment distribution `A_i` (the links of the target word,
//! normalised over the row), and its gradient through the attention softmax, one row at a time, inside the
//! fused decoder sequence ([`crate::model::decoder_sequence`]), beside its composed reference
//! ([`cost_reference`], what the step-by-step decoder path computes). Rows with no link (all of `A_i` zero)
//! cost nothing.
//!
//! - `ce`: `−Σ_j A_ij log(α_ij + ε)`, ε = [`EPS`] (Chen et al. 2016, Garg et al. 2019);
//! - `mse`: `½ Σ_j (α_ij − A_ij)²` (Marian's default).
//!
//! The training loss adds `weight · Σ_rows cost / B` to the summed negative log-likelihood divided by the batch
//! size `B` (model-spec §6).

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};

use crate::config::AlignmentCost;
use crate::kernels::Real;

/// The `ε` inside the cross-entropy's logarithm (an attention weight that underflows to zero costs
/// `−log ε`, not infinity).
pub const EPS: f64 = 1e-6;

/// Whether the target row `a` holds a link (a row of zeros is not guided).
pub fn guided<T: Real>(a: &[T]) -> bool {
    a.iter().any(|&x| x != T::zero())
}

/// One row's cost (0 for a row with no link): `alpha`, the attention row over the sentence's own positions,
/// `a` its target distribution.
pub fn cost_row<T: Real>(alpha: &[T], a: &[T], cost: AlignmentCost) -> f64 {
    if !guided(a) {
        return 0.0;
    }
    let f = |x: T| <T as candle_core::WithDType>::to_f64(x);
    match cost {
        AlignmentCost::Ce => alpha
            .iter()
            .zip(a)
            .filter(|(_, &t)| t != T::zero())
            .map(|(&p, &t)| -f(t) * (f(p) + EPS).ln())
            .sum(),
        AlignmentCost::Mse => alpha
            .iter()
            .zip(a)
            .map(|(&p, &t)| 0.5 * (f(p) - f(t)).powi(2))
            .sum(),
    }
}

/// Adds `g ·` the gradient of one row's cost with respect to the attention scores `e` (through the softmax
/// `α = softmax(e)`) into `de`: `∂c/∂e_j = α_j (∂c/∂α_j − Σ_k α_k ∂c/∂α_k)`, where `∂c/∂α_j` is
/// `−A_j / (α_j + ε)` (ce) or `α_j − A_j` (mse). Nothing for a row with no link.
pub fn cost_grad_row<T: Real>(alpha: &[T], a: &[T], cost: AlignmentCost, g: T, de: &mut [T]) {
    if !guided(a) || g == T::zero() {
        return;
    }
    let eps = T::from_f64c(EPS);
    let dalpha = |p: T, t: T| match cost {
        AlignmentCost::Ce => -t / (p + eps),
        AlignmentCost::Mse => p - t,
    };
    let total = alpha
        .iter()
        .zip(a)
        .fold(T::zero(), |s, (&p, &t)| s + p * dalpha(p, t));
    for ((d, &p), &t) in de.iter_mut().zip(alpha).zip(a) {
        *d += g * p * (dalpha(p, t) - total);
    }
}

/// The composed reference: the summed cost of the attention rows `alpha` `[B, T, S]` against their targets
/// `a` `[B, T, S]` (rows of zeros: no link), a scalar graph tensor.
pub fn cost_reference(alpha: &Tensor, a: &Tensor, cost: AlignmentCost) -> Result<Tensor> {
    match cost {
        AlignmentCost::Ce => (a * (alpha + EPS)?.log()?)?.sum_all()?.neg(),
        AlignmentCost::Mse => {
            // Only the rows with a link.
            let rows = a.sum_keepdim(2)?.ne(0.0)?.to_dtype(alpha.dtype())?;
            (alpha - a)?
                .sqr()?
                .broadcast_mul(&rows)?
                .sum_all()?
                .affine(0.5, 0.0)
        }
    }
}

/// What the fused decoder sequence shares with its loss's graph node ([`loss_node`]): the scaled cost its
/// forward pass computed, and the loss's gradient its backward pass scales the rows' gradients by.
#[derive(Debug, Default)]
pub struct LossCell {
    /// `weight / B · Σ_rows cost`, set by the forward pass.
    pub loss: f64,
    /// `∂(total loss)/∂loss`, set by the loss node's backward pass before the decoder's runs.
    pub grad: f64,
}

/// The guidance a fused decoder sequence runs with: the targets `[B, T, S]` (batch rows in the batch's order),
/// the cost, the scale `weight / B`, and the cell its loss goes through.
#[derive(Clone, Debug)]
pub struct Guidance {
    pub targets: Tensor,
    pub cost: AlignmentCost,
    pub scale: f64,
    pub cell: Arc<Mutex<LossCell>>,
}

/// The guided-alignment loss as a scalar graph node on `token` (the fused decoder sequence's output token):
/// its value is the cell's loss, and its backward pass leaves the loss's gradient in the cell, where the
/// decoder's backward pass (which candle runs after it, the token being its input) reads it.
pub fn loss_node(token: &Tensor, cell: Arc<Mutex<LossCell>>) -> Result<Tensor> {
    token.apply_op1(LossNode { cell })
}

struct LossNode {
    cell: Arc<Mutex<LossCell>>,
}

impl candle_core::CustomOp1 for LossNode {
    fn name(&self) -> &'static str {
        "guided-alignment-loss"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        let loss = self.cell.lock().expect("guided alignment cell").loss;
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(vec![loss as f32]),
            CpuStorage::F64(_) => CpuStorage::F64(vec![loss]),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        };
        Ok((out, Shape::from(())))
    }
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = grad.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?;
        self.cell.lock().expect("guided alignment cell").grad += g;
        Ok(Some(arg.zeros_like()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row gradient against central differences of the row cost through a softmax, both costs.
    #[test]
    fn row_gradient_matches_finite_differences() {
        let e = [0.3f64, -1.2, 0.8, 0.1];
        let a = [0.0f64, 0.5, 0.5, 0.0];
        let softmax = |e: &[f64]| {
            let m = e.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = e.iter().map(|x| (x - m).exp()).sum();
            e.iter().map(|x| (x - m).exp() / z).collect::<Vec<f64>>()
        };
        for cost in [AlignmentCost::Ce, AlignmentCost::Mse] {
            let alpha = softmax(&e);
            let mut de = vec![0.0; 4];
            cost_grad_row(&alpha, &a, cost, 2.0, &mut de);
            for j in 0..4 {
                let at = |d: f64| {
                    let mut x = e;
                    x[j] += d;
                    2.0 * cost_row(&softmax(&x), &a, cost)
                };
                let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
                assert!((fd - de[j]).abs() < 1e-7, "{cost:?} {j}: {fd} vs {}", de[j]);
            }
        }
        // A row with no link costs nothing and adds nothing.
        let mut de = vec![0.0; 4];
        cost_grad_row(&softmax(&e), &[0.0; 4], AlignmentCost::Mse, 1.0, &mut de);
        assert_eq!(de, vec![0.0; 4]);
        assert_eq!(cost_row(&softmax(&e), &[0.0; 4], AlignmentCost::Mse), 0.0);
    }

    /// The composed reference sums the rows' costs.
    #[test]
    fn reference_sums_the_row_costs() {
        let dev = candle_core::Device::Cpu;
        let alpha = [0.2f64, 0.5, 0.3, 0.6, 0.3, 0.1];
        let a = [0.0f64, 1.0, 0.0, 0.0, 0.0, 0.0];
        for cost in [AlignmentCost::Ce, AlignmentCost::Mse] {
            let want = cost_row(&alpha[..3], &a[..3], cost) + cost_row(&alpha[3..], &a[3..], cost);
            let got = cost_reference(
                &Tensor::from_slice(&alpha, (1, 2, 3), &dev).unwrap(),
                &Tensor::from_slice(&a, (1, 2, 3), &dev).unwrap(),
                cost,
            )
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
            assert!((got - want).abs() < 1e-12, "{cost:?}: {got} vs {want}");
        }
    }
}
