//! The integration tests, one binary (one link of candle, axum and rusqlite instead of one per file). Each
//! module is a subject; `common` holds the helpers they share. Run one subject with its path, e.g.
//! `cargo test --release --test it kernels::`; the MPI tests (`mpi`, built with `--features mpi`) run with
//! `cargo test --release --features mpi --test it mpi:: -- --test-threads=1`.

mod analysis_cli;
mod average;
mod bench_cli;
mod bundled_data;
mod cli_errors;
mod common;
mod constraints;
mod data_get;
mod deep;
mod divergence;
mod ensemble;
mod eval_cli;
mod faults;
mod fuzz;
mod gradcheck;
mod guided_alignment;
mod kernels;
mod layer_norm;
mod layout;
mod mpi;
mod pipeline;
mod reproduce;
mod search;
mod selection;
mod serve;
mod steering;
mod tied;
mod training;
mod variants;
mod word_aligner;
