//! cgnmt: context-gated neural machine translation (Tu et al., TACL 2017) on candle.
//!
//! One module per concept of the paper: [`encoder`], [`attention`], [`gate`], [`coverage`], [`decoder_cell`],
//! [`readout`], [`model`], [`beam_search`]; training in [`optim`], [`batcher`], [`train`], [`checkpoint`];
//! configuration in [`config`]. Data preparation lives in the `cgnmt-data` crate and the evaluation metrics
//! (BLEU, chrF, significance tests, AER) in `cgnmt-eval`.

pub mod alignment;
pub mod atomic_file;
pub mod attention;
pub mod averaging;
pub mod batcher;
pub mod beam_search;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod coverage;
pub mod datasets;
pub mod decoder_cell;
pub mod decoder_sequence;
pub mod demo;
pub mod dropout;
pub mod encoder;
pub mod error;
pub mod gate;
pub mod gru;
pub mod init;
pub mod kernels;
pub mod model;
pub mod optim;
pub mod profile;
pub mod readout;
pub mod reproduce;
pub mod rescore;
pub mod selection;
pub mod serve;
pub mod shortlist;
pub mod subjective;
pub mod train;
pub mod translate;

pub use cgnmt_data;
pub use cgnmt_eval;
