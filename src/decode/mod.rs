//! Decoding: the front door, [`translator::Translator`] (open model directories, translate, score, align);
//! beam search over one model or an ensemble ([`beam_search`]), the ranking of its finished hypotheses
//! ([`penalties`]), the text pipeline over raw or tokenised text ([`translate`]), vocabulary shortlists from
//! an IBM Model 1 lexicon ([`shortlist`]), n-best rescoring ([`rescore`]), the log-probability of given
//! translations ([`scoring`]), word alignments from attention ([`alignment`]), lexically constrained
//! decoding ([`constraints`]) and the decoding settings chosen on dev that travel with a model
//! ([`settings`]).

pub mod alignment;
pub mod beam_search;
pub mod constraints;
pub mod output;
pub mod penalties;
pub mod rescore;
pub mod scoring;
pub mod settings;
pub mod shortlist;
pub mod translate;
pub mod translator;
