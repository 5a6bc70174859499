//! One file per subcommand, named after it: its arguments and a short `run` that calls the library (the
//! `cgnmt` crate) or an application crate (`cgnmt-serve`, `cgnmt-reproduce`, `cgnmt-datasets`,
//! `cgnmt-subjective`, the data and evaluation crates). No command uses another.

pub mod aer;
pub mod align;
pub mod align_corpus;
pub mod analyze;
pub mod average;
pub mod bench;
pub mod compare;
pub mod data;
pub mod demo;
pub mod eval_pairs;
pub mod eval_report;
pub mod info;
pub mod plot;
pub mod prepare;
pub mod reproduce;
pub mod rescore;
pub mod score;
pub mod select;
pub mod serve;
pub mod shortlist;
pub mod train;
pub mod translate;
