//! One module per subcommand (its arguments and its `run`), and the applications behind them: the demo, the
//! paper's reproduction, the server, the benchmarks, public corpora and the subjective evaluation. `main.rs`
//! only parses the command line and dispatches here (or to the library and the data and evaluation crates).

pub mod align;
pub mod average;
pub mod bench;
pub mod datasets;
pub mod demo;
pub mod info;
pub mod process;
pub mod reproduce;
pub mod select;
pub mod serve;
pub mod shortlist;
pub mod subjective;
pub mod train;
pub mod translate;
