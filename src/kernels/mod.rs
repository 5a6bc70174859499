//! The fused CPU kernels and their shared machinery. Here: the `--kernels reference|fused` switch ([`Kernels`]);
//! in the files beside it, one role each:
//! - `cpu`: CPU feature probes, the element types ([`Real`]) with vectorisable `exp`/`tanh`/`σ`, the dtype
//!   and SIMD dispatch macros, storage slices, reductions, buffer fills, row parallelism;
//! - `gemm`: products into caller buffers ([`Mat`], [`gemm_into`], [`Oriented`]), their gradients, the
//!   blocked transpose;
//! - `pass`: the recurrent weights prepared once per pass ([`begin_pass`], [`rec_matmul`]) and the gradient
//!   hand-over;
//! - `shared`: inputs and outputs whose gradients accumulate in place ([`Shared`]);
//! - `ops`: [`linear`], [`sigmoid`], [`embedding`], [`select_rows`];
//! - `top_k`: a row's `k` best entries ([`top_k()`]), for beam search;
//! - [`packed_gemm`]: the per-step products' micro-kernel over weights packed once per pass, and
//!   [`quantized_gemm`], its int8 form for `translate --int8`.
//!
//! The fused kernels of the paper's concepts sit here, one file per concept, each with the concept's row
//! maths and custom ops beside their composed references (and the gradient checks that tie them, in
//! `tests/it/kernels/`): [`attention`] (scores; softmax + context; decoding's attention over sentence rows),
//! [`gru`] (the GRU update and step, shared by the encoder and the decoder), [`layer_norm`] (a row's blocks
//! normalised, the building block of a layer-normalised GRU), [`encoder`] (both directions'
//! recurrences as one op), [`gate`] (the gate's scales on word and context terms), [`coverage`] (the coverage
//! rows of the decoder's recurrence), [`readout`] (maxout; output layer + log-softmax + NLL; inference
//! log-softmax; the readout rows). `model/<concept>.rs` holds the concept itself: its parameters, its step and
//! what it hands to the decoder; `model::decoder_sequence` (the decoder's whole recurrence as one op) runs
//! these rows. Each fused op is a candle custom op with a hand-derived backward pass; on devices without a
//! fused twin (CUDA, Metal) the composed reference runs instead.

use candle_core::{CpuStorage, CustomOp2, Device, Layout, Result, Shape, Tensor, WithDType};
use serde::{Deserialize, Serialize};

pub mod attention;
pub mod coverage;
mod cpu;
pub mod encoder;
pub mod gate;
mod gemm;
mod gemm_common;
pub mod gru;
pub mod guided_alignment;
pub mod layer_norm;
mod ops;
pub mod packed_gemm;
mod pass;
pub mod profile;
pub mod quantized_gemm;
pub mod readout;
mod shared;
mod top_k;

pub use cpu::*;
pub use gemm::*;
pub use gemm_common::Start;
pub use ops::*;
pub use pass::*;
pub use shared::*;
pub use top_k::top_k;

/// Which implementation of the hot recurrent steps runs. The choice is made one way: it is a model's
/// [`crate::model::Model::kernels`] field, which every part of the model (encoder, attention, gate, coverage,
/// transition, readout) takes as an argument; a model built by this process starts with the process's choice
/// ([`Kernels::process_choice`], the CLI's `--kernels`), and tests and `bench` change it with `set_kernels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// Composed candle ops (the reference every fused kernel is tested against).
    Reference,
    /// Fused CPU kernels with hand-derived backward passes (composed ops on other devices).
    Fused,
    /// The fused encoder op and the fused row ops (each with its hand-derived backward pass) inside the
    /// composed decoder recurrence: what a model whose decoder has no fused sequence op runs when fused kernels
    /// are asked for (a layer-normalised model, see `Model::set_kernels`). Not a command-line choice.
    FusedOps,
}

static PROCESS_KERNELS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Kernels {
    /// The kernels a model built now starts with: fused, unless the process chose otherwise with
    /// [`Kernels::set_process_default`] (the CLI's `--kernels`). Read by `Model::new` only.
    pub fn process_choice() -> Self {
        match PROCESS_KERNELS.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Kernels::Reference,
            _ => Kernels::Fused,
        }
    }

    /// Whether the fused sequence ops (the encoder's, the decoder's, decoding's fused steps) run for tensors
    /// on `dev`.
    pub fn fused_on(self, dev: &Device) -> bool {
        self == Kernels::Fused && dev.is_cpu()
    }

    /// Whether a fused row op (a product, a gate, a normalisation, the output layer) runs for tensors on `dev`:
    /// with [`Kernels::Fused`] and [`Kernels::FusedOps`].
    pub fn ops_fused_on(self, dev: &Device) -> bool {
        matches!(self, Kernels::Fused | Kernels::FusedOps) && dev.is_cpu()
    }

    /// The kernels every model built afterwards in this process starts with.
    pub fn set_process_default(k: Kernels) {
        let v = match k {
            Kernels::Fused | Kernels::FusedOps => 0,
            Kernels::Reference => 1,
        };
        PROCESS_KERNELS.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernels::Reference => "reference",
            Kernels::Fused => "fused",
            Kernels::FusedOps => "fused encoder, fused row ops in the composed decoder",
        }
    }
}
