//! The paper's initialisation (model-spec §6), applied by parameter name after the model has been built:
//! N(0, 0.01²) for weights, orthogonal recurrent matrices, N(0, 0.001²) for attention, gate and coverage input
//! weights, `v` and biases zero. Values come from a seeded generator, in sorted parameter order, so a seed fixes
//! the initial model.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::Result;

/// How one parameter is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitRule {
    Zero,
    /// A layer normalisation's gain (`….ln_*.g`).
    One,
    Normal(f64),
    /// Orthogonal square blocks of side `n` laid side by side (`U_ru` = [U_r | U_u]).
    Orthogonal,
}

/// The rule for a parameter path such as `decoder.gate.U_z` or `encoder.fwd.U_ru`.
pub fn rule_for(name: &str) -> InitRule {
    let leaf = name.rsplit('.').next().unwrap_or(name);
    let in_scope = |s: &str| name.split('.').any(|p| p == s);
    if leaf == "g" && name.split('.').any(|p| p.starts_with("ln_")) {
        return InitRule::One;
    }
    if leaf.starts_with('b') || leaf == "v" || leaf == "z_logit" {
        return InitRule::Zero;
    }
    if in_scope("attention") || in_scope("gate") || in_scope("coverage") || in_scope("scalar_gate")
    {
        // Recurrent matrices of the coverage GRU stay orthogonal like every recurrent matrix.
        if (leaf == "U" || leaf == "U_ru") && in_scope("coverage") {
            return InitRule::Orthogonal;
        }
        return InitRule::Normal(0.001);
    }
    if leaf == "U" || leaf == "U_ru" {
        return InitRule::Orthogonal;
    }
    InitRule::Normal(0.01)
}

fn normal(rng: &mut StdRng) -> f64 {
    // Box-Muller.
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A random `n × n` orthogonal matrix (Gram-Schmidt on a Gaussian matrix), row-major.
fn orthogonal(n: usize, rng: &mut StdRng) -> Vec<f64> {
    let mut q: Vec<Vec<f64>> = Vec::with_capacity(n);
    while q.len() < n {
        let mut v: Vec<f64> = (0..n).map(|_| normal(rng)).collect();
        for _pass in 0..2 {
            for b in &q {
                let d: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
                v.iter_mut().zip(b).for_each(|(x, y)| *x -= d * y);
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-8 {
            v.iter_mut().for_each(|x| *x /= norm);
            q.push(v);
        }
    }
    q.into_iter().flatten().collect()
}

/// Initialise every variable of `varmap` by its name's rule.
pub fn init_params(varmap: &VarMap, seed: u64) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = varmap.data().lock().expect("varmap lock");
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var = &data[name];
        let shape = var.shape().clone();
        let dims = shape.dims().to_vec();
        let n: usize = dims.iter().product();
        let values: Vec<f64> = match rule_for(name) {
            InitRule::Zero => vec![0.0; n],
            InitRule::One => vec![1.0; n],
            InitRule::Normal(sd) => (0..n).map(|_| normal(&mut rng) * sd).collect(),
            InitRule::Orthogonal => {
                let (rows, cols) = (dims[0], dims.get(1).copied().unwrap_or(1));
                if cols % rows != 0 {
                    (0..n).map(|_| normal(&mut rng) * 0.01).collect()
                } else {
                    // [rows, k*rows]: k orthogonal blocks side by side.
                    let k = cols / rows;
                    let blocks: Vec<Vec<f64>> =
                        (0..k).map(|_| orthogonal(rows, &mut rng)).collect();
                    let mut out = vec![0.0; n];
                    for r in 0..rows {
                        for (bi, b) in blocks.iter().enumerate() {
                            out[r * cols + bi * rows..r * cols + (bi + 1) * rows]
                                .copy_from_slice(&b[r * rows..(r + 1) * rows]);
                        }
                    }
                    out
                }
            }
        };
        let t = Tensor::from_vec(values, dims.as_slice(), &Device::Cpu)?
            .to_dtype(var.dtype())?
            .to_device(var.device())?;
        var.set(&t)?;
    }
    Ok(())
}

/// Total number of scalar parameters.
pub fn count(varmap: &VarMap) -> usize {
    varmap.all_vars().iter().map(|v| v.elem_count()).sum()
}

/// The parameter counts (as [`count_by_component`]) of the model a configuration describes, with its
/// vocabulary sizes (`data.src_vocab_size` / `data.tgt_vocab_size` words plus EOS and UNK), built without
/// initialising it.
pub fn parameter_counts(cfg: &crate::config::Config) -> crate::error::Result<Vec<(String, usize)>> {
    let (_model, varmap) = crate::model::Model::build_uninit(
        &cfg.model,
        cfg.data.src_vocab_size + 2,
        cfg.data.tgt_vocab_size + 2,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )?;
    Ok(count_by_component(&varmap))
}

/// Parameter count grouped by the first path component (`encoder`, `decoder`, ...) and by the second
/// (`decoder.gate`, ...), in name order.
pub fn count_by_component(varmap: &VarMap) -> Vec<(String, usize)> {
    let data = varmap.data().lock().expect("varmap lock");
    let mut map = std::collections::BTreeMap::<String, usize>::new();
    for (name, var) in data.iter() {
        let parts: Vec<&str> = name.split('.').collect();
        let key = if parts.len() > 2 {
            format!("{}.{}", parts[0], parts[1])
        } else {
            parts[0].to_string()
        };
        *map.entry(key).or_default() += var.elem_count();
    }
    map.into_iter().collect()
}

/// Variables are created as zeros and then initialised by [`init_params`] (candle's default init would draw
/// random numbers for every parameter only to have them overwritten).
pub const ZERO: candle_nn::Init = candle_nn::Init::Const(0.0);

/// The dtype used for training and decoding.
pub const DTYPE: DType = DType::F32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_follow_the_paper() {
        assert_eq!(rule_for("encoder.fwd.U_ru"), InitRule::Orthogonal);
        assert_eq!(rule_for("decoder.cell.U"), InitRule::Orthogonal);
        assert_eq!(rule_for("decoder.attention.A"), InitRule::Normal(0.001));
        assert_eq!(rule_for("decoder.attention.v"), InitRule::Zero);
        assert_eq!(rule_for("decoder.gate.W_z"), InitRule::Normal(0.001));
        assert_eq!(rule_for("decoder.cell.W"), InitRule::Normal(0.01));
        assert_eq!(rule_for("decoder.cell.b"), InitRule::Zero);
    }

    #[test]
    fn orthogonal_blocks_are_orthogonal() {
        let mut rng = StdRng::seed_from_u64(3);
        let n = 7;
        let q = orthogonal(n, &mut rng);
        for i in 0..n {
            for j in 0..n {
                let d: f64 = (0..n).map(|k| q[i * n + k] * q[j * n + k]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((d - want).abs() < 1e-10, "q q^T[{i},{j}] = {d}");
            }
        }
    }
}
