//! Integration tests of cgnmt-data (one binary to keep link time down).
//! Data: `$CGNMT_DATA` or `<crate>/../../../shared/data`.

mod bpe;
mod common;
mod corpus;
mod prepare;
mod tokenize;
mod vocab;
